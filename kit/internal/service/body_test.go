package service

import (
	"log/slog"
	"reflect"
	"testing"
)

func TestJSONField(t *testing.T) {
	eventID := JSONField("event_id")
	tests := []struct{ body, want string }{
		{`{"event_id":"e-1","order_id":"o"}`, "e-1"},
		{`{"order_id":"o"}`, ""},
		{`{"event_id":42}`, ""},
		{`{"event_id":"e-2"`, ""},
		{"\xff", ""},
		{`[1,2]`, ""},
	}
	for _, tt := range tests {
		if got := eventID([]byte(tt.body)); got != tt.want {
			t.Errorf("JSONField(event_id)(%q) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

func TestJSONAttrs(t *testing.T) {
	attrs := JSONAttrs("order_id", "customer_id")
	got := attrs([]byte(`{"order_id":"o-1","customer_id":7,"x":"y"}`))
	if want := []slog.Attr{slog.String("order_id", "o-1")}; !reflect.DeepEqual(got, want) {
		t.Errorf("attrs %v, want %v", got, want)
	}
	if got := attrs([]byte(`not json`)); got != nil {
		t.Errorf("attrs of an unreadable body %v, want none", got)
	}
}
