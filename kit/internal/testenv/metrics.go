package testenv

import (
	"bufio"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Metric scrapes http://addr/metrics and returns the sum of the samples of
// name whose labels include every pair of labels ("outcome", "processed",
// …): 0 when there is none yet (a counter not yet incremented has no sample).
func Metric(t testing.TB, addr, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("Metric %s: labels come in name, value pairs, got %q", name, labels)
	}
	resp, err := probe.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s", addr, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		metric, set, value, err := parseSample(line)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		if metric != name || !hasLabels(set, labels) {
			continue
		}
		sum += value
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

// parseSample reads a sample line of the Prometheus text format:
// name{label="value",…} value [timestamp]. Label values may hold spaces,
// commas, braces and the escapes \\, \" and \n.
func parseSample(line string) (name string, labels map[string]string, value float64, err error) {
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return "", nil, 0, errors.New("no value")
	}
	name, rest := line[:i], line[i:]
	labels = map[string]string{}
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, "=\"")
			if eq < 0 {
				return "", nil, 0, errors.New("a label without a quoted value")
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var v strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				switch {
				case c == '\\' && j+1 < len(rest):
					j++
					switch rest[j] {
					case 'n':
						v.WriteByte('\n')
					default:
						v.WriteByte(rest[j])
					}
				case c == '"':
					rest, closed = rest[j+1:], true
				default:
					v.WriteByte(c)
				}
				if closed {
					break
				}
			}
			if !closed {
				return "", nil, 0, errors.New("an unterminated label value")
			}
			labels[key] = v.String()
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", nil, 0, errors.New("no value")
	}
	value, err = strconv.ParseFloat(fields[0], 64)
	return name, labels, value, err
}

// hasLabels reports whether set holds every name, value pair.
func hasLabels(set map[string]string, pairs []string) bool {
	for i := 0; i < len(pairs); i += 2 {
		if v, ok := set[pairs[i]]; !ok || v != pairs[i+1] {
			return false
		}
	}
	return true
}
