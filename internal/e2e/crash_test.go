package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/kittest"
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

// crashCase is a crash point and the trace its crash leaves for the restart
// to repair, if any.
type crashCase struct {
	point string
	trace func(t *testing.T, s *stack) bool
}

// Each crash point ends the service as abruptly as SIGKILL would; after a restart every
// order is paid exactly once, and the point leaves its own trace.
func TestCrashPoints(t *testing.T) {
	crashPoints(t, nil, []crashCase{
		{"after-inbox-insert", nil},
		{"after-gateway-charge", gatewayReplayed},
		{"after-commit", duplicateCounted},
		{"after-ack", nil},
	})
}

// The same with the buffered inbox: its ingest passes the runtime's three
// points (after-commit is the crash between the ingest's commit and its ack),
// its processing the service's after-gateway-charge and two of its own. A
// short handler timeout keeps the lease of a message claimed before a crash
// short.
func TestCrashPointsBuffered(t *testing.T) {
	crashPoints(t, bufferedEnv("GATEWAY_TIMEOUT=1s", "HANDLER_TIMEOUT=2s"), []crashCase{
		{"after-inbox-insert", nil},
		{"after-commit", duplicateCounted},
		{"after-ack", nil},
		{"after-claim", func(t *testing.T, s *stack) bool { // claimed, crashed, claimed again after the lease
			return scalar(t, s.paymentsDB, "SELECT count(*) FROM inbox_messages WHERE attempts >= 2") >= 1
		}},
		{"after-gateway-charge", gatewayReplayed},
		{"after-process-commit", nil},
	})
}

func gatewayReplayed(t *testing.T, s *stack) bool {
	return scalar(t, s.gatewayDB, "SELECT coalesce(sum(replays), 0) FROM charges") >= 1 // charged before the crash, replayed after
}

func duplicateCounted(t *testing.T, s *stack) bool {
	return metric(t, s.serviceAddr, `consumer_messages_total{consumer="payment-service",outcome="duplicate"}`) >= 1
}

func crashPoints(t *testing.T, serviceEnv []string, tests []crashCase) {
	for _, tt := range tests {
		t.Run(tt.point, func(t *testing.T) {
			s := startStack(t, []string{"FAULT_LATENCY=30ms"}, append([]string{"FAULTS_ENABLED=true"}, serviceEnv...))
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
				kittest.Eventually(t, 30*time.Second, "the trace of "+tt.point, func() (bool, error) { return tt.trace(t, s), nil })
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
