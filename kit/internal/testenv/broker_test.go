package testenv

import (
	"reflect"
	"testing"
)

// The watermark read back is one that sets the broker's again, in either
// of its forms; anything else is refused rather than written back.
func TestWatermarkOfTakesTheBrokersTwoForms(t *testing.T) {
	for in, want := range map[string]string{"0.4\n": "0.4", "{absolute,1073741824}": "{absolute,1073741824}", "1.0e-6": "1.0e-6", `{absolute,"1GB"}`: `{absolute,"1GB"}`} {
		if got, err := watermarkOf(in); err != nil || got != want {
			t.Errorf("watermarkOf(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "{absolute, 1}", "os:cmd(\"x\")", "0.4, halt()"} {
		if got, err := watermarkOf(in); err == nil {
			t.Errorf("watermarkOf(%q) = %q, want an error", in, got)
		}
	}
}

// A queue without counts (a quorum queue without a leader: rabbitmqctl
// prints "" where erl_call's listing leaves them out) is not counted, and a
// warning around the JSON is no matter.
func TestParseQueuesMarksAQueueWithoutCounts(t *testing.T) {
	qs, err := ParseQueues("Warning: something\n" + `[{"name":"work","messages":3,"messages_ready":1,"messages_unacknowledged":2,"consumers":1,"leader":"rabbit@a"},` +
		`{"name":"retry","messages":"","messages_ready":"","messages_unacknowledged":"","consumers":"","leader":""},{"name":"dlq"}]`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Queue{
		{Name: "work", Counted: true, Messages: 3, Ready: 1, Unacked: 2, Consumers: 1, Leader: "rabbit@a"},
		{Name: "retry"},
		{Name: "dlq"},
	}
	if !reflect.DeepEqual(qs, want) {
		t.Errorf("ParseQueues = %+v, want %+v", qs, want)
	}
	if _, err := ParseQueues("Error: no such vhost"); err == nil {
		t.Error("no JSON read as a list of queues")
	}
}
