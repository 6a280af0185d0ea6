package payment

import (
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/kit/kittest"
)

func TestIdempotencyKeyDependsOnTheOrderOnly(t *testing.T) {
	// The gateway keeps charges by this key: a redelivery, a retry and a
	// republish of the same order under a new event id must send the same.
	if got, want := IdempotencyKey("o-1"), "order-charge:o-1"; got != want {
		t.Fatalf("IdempotencyKey(o-1) = %q, want %q", got, want)
	}
	if IdempotencyKey("o-1") == IdempotencyKey("o-2") {
		t.Fatal("two orders share an idempotency key")
	}
}

// The payment service's timeouts checked against each other and the kit's at
// start: each broken relation names its variable.
func TestServiceChecksTimeoutRelations(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		variable string // "" means valid
	}{
		{"defaults", nil, ""},
		{"gateway call longer than a handler run", map[string]string{"GATEWAY_TIMEOUT": "15s"}, "GATEWAY_TIMEOUT"},
		{"no in-flight window", map[string]string{"GATEWAY_IN_FLIGHT_TIMEOUT": "0s"}, "GATEWAY_IN_FLIGHT_TIMEOUT"},
		// Two retries of 1s are spent long before a charge stuck in flight
		// is taken over after 30s: the message is dead-lettered meanwhile.
		{"retries inside the window", map[string]string{"RETRY_DELAYS": "1s", "MAX_ATTEMPTS": "3"}, "GATEWAY_IN_FLIGHT_TIMEOUT"},
		{"retries outlast a 1s window", map[string]string{"RETRY_DELAYS": "1s", "MAX_ATTEMPTS": "3", "GATEWAY_IN_FLIGHT_TIMEOUT": "1s"}, ""},
		// 5s+10s+10s+10s = 35s of delays, but jitter may cut them to 28s.
		{"jitter shortens the retries", map[string]string{"RETRY_DELAYS": "5s,10s", "MAX_ATTEMPTS": "5"}, "GATEWAY_IN_FLIGHT_TIMEOUT"},
		{"one more retry", map[string]string{"RETRY_DELAYS": "5s,10s", "MAX_ATTEMPTS": "6"}, ""},
		{"no retries at all", map[string]string{"MAX_ATTEMPTS": "1"}, "GATEWAY_IN_FLIGHT_TIMEOUT"},
	}
	// A setting that is wrong is named alone: the checks derived from it
	// do not blame another variable too.
	t.Run("invalid retries are blamed alone", func(t *testing.T) {
		t.Setenv("MAX_ATTEMPTS", "0")
		_, err := kittest.LoadConfig(Service())
		if err == nil || !strings.Contains(err.Error(), "MAX_ATTEMPTS") || strings.Contains(err.Error(), "GATEWAY_IN_FLIGHT_TIMEOUT") ||
			strings.Contains(err.Error(), "IDEMPOTENCY_KEY_TTL") {
			t.Fatalf("err = %v, want MAX_ATTEMPTS named alone", err)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := kittest.LoadConfig(Service())
			switch {
			case tt.variable == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tt.variable != "" && (err == nil || !strings.Contains(err.Error(), tt.variable)):
				t.Fatalf("err = %v, want one naming %s", err, tt.variable)
			}
		})
	}
}
