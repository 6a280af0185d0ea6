package e2e_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// publish runs the publisher to completion.
func (s *stack) publish(t *testing.T, args ...string) {
	t.Helper()
	code, out := run(t, 5*time.Minute, "order-publisher", []string{"AMQP_URL=" + s.amqpURL}, args...)
	if code != 0 {
		t.Fatalf("order-publisher exited %d:\n%s", code, out)
	}
}

func (s *stack) payments(t *testing.T) int {
	return scalar(t, s.paymentsDB, "SELECT count(*) FROM payments")
}

// assertExactlyOnce checks n payments, one charge per order, no dead letter.
func (s *stack) assertExactlyOnce(t *testing.T, n int) {
	t.Helper()
	kittest.Reaches(t, time.Minute, "all payments", n, func() (int, error) { return s.payments(t), nil })
	if p := s.payments(t); p != n {
		t.Errorf("%d payments for %d orders", p, n)
	}
	if c := scalar(t, s.gatewayDB, "SELECT count(*) FROM charges"); c != n {
		t.Errorf("%d charge rows for %d orders", c, n)
	}
	if d := scalar(t, s.gatewayDB, "SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY 1 HAVING count(*) > 1) x"); d != 0 {
		t.Errorf("%d orders charged twice", d)
	}
	if q := queueDepth(t, s.amqpURL, "payments.order-placed.dlq"); q != 0 {
		t.Errorf("%d messages dead-lettered", q)
	}
}

// SIGTERM under load: in-flight messages finish and are acked, the process
// exits 0, and after a restart every order is paid exactly once.
func TestSIGTERMUnderLoad(t *testing.T) {
	sigtermUnderLoad(t, nil)
}

// The same with the buffered inbox: the ingest stores what the broker sent
// before the cancel, the processing finishes what it claimed, and the rest
// waits in the table for the restart.
func TestSIGTERMUnderLoadBuffered(t *testing.T) {
	sigtermUnderLoad(t, bufferedEnv())
}

func sigtermUnderLoad(t *testing.T, serviceEnv []string) {
	s := startStack(t, []string{"FAULT_LATENCY=20ms"}, append([]string{"SHUTDOWN_TIMEOUT=15s"}, serviceEnv...))
	s.publish(t, "-count", "600", "-duplicate-rate", "0.1")
	kittest.Eventually(t, time.Minute, "some payments", func() (bool, error) { return s.payments(t) >= 100, nil })
	s.service.signal(t, syscall.SIGTERM)
	if code := s.service.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	stoppedAt := s.payments(t)
	if stoppedAt == 600 {
		t.Fatal("everything was paid before the stop: the test proved nothing")
	}
	s.startService(t)
	s.assertExactlyOnce(t, 600)
	t.Logf("%d of 600 paid before SIGTERM", stoppedAt)
}

// A handler still running when the shutdown timeout ends is abandoned: its
// transaction rolls back and its delivery stays unacked, so it is redelivered
// after a restart and applied once.
func TestShutdownTimeoutAbandonsInFlightMessages(t *testing.T) {
	s := startStack(t, []string{"FAULT_LATENCY=3s"},
		[]string{"SHUTDOWN_TIMEOUT=500ms", "GATEWAY_TIMEOUT=10s", "HANDLER_TIMEOUT=20s"})
	s.publish(t, "-count", "20")
	kittest.Eventually(t, time.Minute, "charges in flight", func() (bool, error) {
		return scalar(t, s.gatewayDB, "SELECT count(*) FROM charges") > 0, nil
	})
	s.service.signal(t, syscall.SIGTERM)
	if code := s.service.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(s.service.out.String(), "abandoning them unacked") {
		t.Fatal("no message was abandoned at the timeout: the test proved nothing")
	}
	s.startService(t)
	s.assertExactlyOnce(t, 20)
}
