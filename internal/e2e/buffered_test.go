package e2e_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// The gateway is down for a long time (503 for every charge; here seconds,
// standing for 45 minutes): the buffered inbox stores and acks every order at
// once, so nothing waits unacked on the broker and nothing goes through the
// retry queues; the processing pauses once PAUSE_AFTER_FAILURES charges in a
// row failed, spending no attempts; when the gateway is back every order is
// charged and paid once, none parked.
func TestBufferedGatewayOutage(t *testing.T) {
	s := startStack(t, []string{"FAULTS_ENABLED=true", "FAULT_ERROR_RATE=1"},
		bufferedEnv("BUFFER_RETRY_DELAYS=100ms,500ms,1s", "BUFFER_MAX_ATTEMPTS=1000"))
	s.publish(t, "-count", "200", "-duplicate-rate", "0.1")
	stored := `consumer_messages_total{consumer="payment-service",outcome="stored"}`
	kittest.Eventually(t, time.Minute, "200 orders stored", func() (bool, error) { return metric(t, s.serviceAddr, stored) == 200, nil })
	// The outage goes on until the processing paused: PAUSE_AFTER_FAILURES
	// charges failed in a row.
	kittest.Eventually(t, time.Minute, "the processing paused", func() (bool, error) {
		return metric(t, s.serviceAddr, `consumer_pauses_total{cause="handler_failing",consumer="payment-service"}`) >= 1, nil
	})
	for _, q := range []string{"payments.order-placed", "payments.order-placed.retry.100ms", "payments.order-placed.retry.500ms"} {
		if ready, unacked := brokerHolds(t, s.amqpURL, q); ready+unacked != 0 {
			t.Errorf("during the outage %s holds %d ready and %d unacked messages, want none", q, ready, unacked)
		}
	}
	tried := metric(t, s.serviceAddr, `consumer_messages_total{consumer="payment-service",outcome="retried"}`) +
		metric(t, s.serviceAddr, `consumer_messages_total{consumer="payment-service",outcome="requeued"}`)
	paused := metric(t, s.serviceAddr, `consumer_pauses_total{cause="handler_failing",consumer="payment-service"}`)
	if p := s.payments(t); p != 0 || tried == 0 || paused == 0 {
		t.Fatalf("during the outage: %d payments, %d failed runs, %d pauses; want none paid, the processing paused", p, tried, paused)
	}
	gatewayFaults(t, "http://"+s.gatewayAddr, `{"error_rate":0}`)
	s.assertExactlyOnce(t, 200)
	if n := scalar(t, s.paymentsDB, "SELECT count(*) FROM inbox_messages WHERE status <> 'processed'"); n != 0 {
		t.Errorf("%d stored messages not processed", n)
	}
	t.Logf("%d failed runs and %d pauses during the outage", tried, paused)
}

// brokerHolds reads a queue's ready and unacknowledged messages.
func brokerHolds(t *testing.T, amqpURL, queue string) (ready, unacked int) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	qs := kittest.Queues(t, strings.TrimPrefix(u.Path, "/"))
	for _, q := range qs {
		if q.Name == queue {
			if !q.Counted {
				t.Fatalf("queue %s listed without counts: %+v", queue, q)
			}
			return q.Ready, q.Unacked
		}
	}
	t.Fatalf("queue %s not listed: %+v", queue, qs)
	return 0, 0
}
