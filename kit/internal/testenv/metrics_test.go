package testenv

import "testing"

// Label values may hold what splits a naive parser: spaces, commas, braces,
// escaped quotes and backslashes, tabs.
func TestParseSample(t *testing.T) {
	cases := []struct {
		line   string
		name   string
		labels map[string]string
		value  float64
	}{
		{`up 1`, "up", map[string]string{}, 1},
		{`consumer_messages_total{consumer="x",outcome="processed"} 12`, "consumer_messages_total",
			map[string]string{"consumer": "x", "outcome": "processed"}, 12},
		{`m{reason="bad amount, {really}"} 2 1700000000000`, "m", map[string]string{"reason": "bad amount, {really}"}, 2},
		{`m{a="say \"hi\"",b="back\\slash",c="line\nbreak",d="tab	here"} 5`, "m",
			map[string]string{"a": `say "hi"`, "b": `back\slash`, "c": "line\nbreak", "d": "tab\there"}, 5},
		{`m{a="x",} 3.5e+00`, "m", map[string]string{"a": "x"}, 3.5},
	}
	for _, c := range cases {
		name, labels, value, err := parseSample(c.line)
		if err != nil || name != c.name || value != c.value || len(labels) != len(c.labels) {
			t.Errorf("%q: %q %v %v (%v)", c.line, name, labels, value, err)
			continue
		}
		for k, v := range c.labels {
			if labels[k] != v {
				t.Errorf("%q: label %s = %q, want %q", c.line, k, labels[k], v)
			}
		}
	}
	for _, bad := range []string{`m{a="x} 1`, `m{a=x} 1`, `m{a="x"}`} {
		if _, _, _, err := parseSample(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
