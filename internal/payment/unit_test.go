package payment

import (
	"testing"
)

func TestEventID(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"event_id":"e-1","order_id":"o"}`, "e-1"},
		{`{"order_id":"o"}`, ""},
		{`{"event_id":42}`, ""},
		{`{"event_id":"e-2"`, ""},
		{"\xff", ""},
	}
	for _, tt := range tests {
		if got := EventID([]byte(tt.body)); got != tt.want {
			t.Errorf("EventID(%q) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

func TestIdempotencyKeyDependsOnTheOrderOnly(t *testing.T) {
	if IdempotencyKey("o-1") != IdempotencyKey("o-1") || IdempotencyKey("o-1") == IdempotencyKey("o-2") {
		t.Fatal("the key must be a function of the order id alone")
	}
}
