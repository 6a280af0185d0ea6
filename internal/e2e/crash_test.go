package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/faults"
	"github.com/inbox-template/payment-service/internal/testenv"
)

func post(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Each crash point ends the service as abruptly as SIGKILL would; after a restart every
// order is paid exactly once, and the point leaves its own trace.
func TestCrashPoints(t *testing.T) {
	tests := []struct {
		point string
		trace func(t *testing.T, s *stack) bool // evidence of what the crash left to repair, if any
	}{
		{"after-inbox-insert", nil},
		{"after-gateway-charge", func(t *testing.T, s *stack) bool {
			return scalar(t, s.gatewayDB, "SELECT coalesce(sum(replays), 0) FROM charges") >= 1 // charged before the crash, replayed after
		}},
		{"after-commit", func(t *testing.T, s *stack) bool {
			return metric(t, s.serviceAddr, `consumer_messages_total{consumer="payment-service",outcome="duplicate"}`) >= 1
		}},
		{"after-ack", nil},
	}
	for _, tt := range tests {
		t.Run(tt.point, func(t *testing.T) {
			s := startStack(t, []string{"FAULT_LATENCY=30ms"}, []string{"FAULTS_ENABLED=true"})
			if code := post(t, "http://"+s.serviceAddr+"/faults/crash?at="+tt.point); code != http.StatusNoContent {
				t.Fatalf("arming answered %d", code)
			}
			s.publish(t, "-count", "50")
			s.service.wait(t, time.Minute)
			if code := s.service.cmd.ProcessState.ExitCode(); code != faults.ExitCode {
				t.Fatalf("service ended with %v, want exit status %d of a crash point", s.service.cmd.ProcessState, faults.ExitCode)
			}
			s.startService(t)
			s.assertExactlyOnce(t, 50)
			if tt.trace != nil {
				testenv.Eventually(t, 30*time.Second, "the trace of "+tt.point, func() (bool, error) { return tt.trace(t, s), nil })
			}
		})
	}
}

func TestFaultEndpointsAbsentByDefault(t *testing.T) {
	s := startStack(t, nil, nil)
	if code := post(t, "http://"+s.serviceAddr+"/faults/crash?at=after-commit"); code != http.StatusNotFound {
		t.Fatalf("POST /faults/crash without FAULTS_ENABLED answered %d, want 404", code)
	}
}
