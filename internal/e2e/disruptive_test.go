//go:build disruptive

package e2e_test

import (
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/kit/testenv"
)

// This file holds tests that disturb the whole broker, not just their vhost.
// They are built only with -tags disruptive and run on their own, after the
// main suite (see the Makefile's test target), so they never hit another test.

// The broker application is stopped and started again while the publisher and
// the service are both busy: every confirmed order is paid exactly once.
func TestDisruptiveBrokerRestartUnderLoad(t *testing.T) {
	brokerRestartUnderLoad(t, nil)
}

// The same with the buffered inbox: its ingest reconnects, and its
// processing goes on from the table while the broker is away.
func TestDisruptiveBrokerRestartUnderLoadBuffered(t *testing.T) {
	brokerRestartUnderLoad(t, bufferedEnv())
}

func brokerRestartUnderLoad(t *testing.T, serviceEnv []string) {
	s := startStack(t, []string{"FAULT_LATENCY=5ms"}, append([]string{"RECONNECT_MAX_WAIT=3s"}, serviceEnv...))
	pub := start(t, "order-publisher", []string{"AMQP_URL=" + s.amqpURL},
		"-count", "1500", "-rate", "300", "-duplicate-rate", "0.1")
	testenv.Eventually(t, time.Minute, "payments under way", func() (bool, error) { return s.payments(t) >= 200, nil })
	testenv.Ctl(t, "stop_app")
	time.Sleep(5 * time.Second)
	testenv.Ctl(t, "start_app")
	testenv.Ctl(t, "await_startup")
	if code := pub.wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("publisher exited %d:\n%s", code, pub.out.String())
	}
	s.assertExactlyOnce(t, 1500)
	if metric(t, s.serviceAddr, `consumer_reconnects_total{consumer="payment-service"}`) < 1 {
		t.Error("the service did not count a reconnect")
	}
}
