package e2e_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/kit/testenv"
	"github.com/inbox-template/payment-service/internal/kit/testenv/faultkit"
)

// paymentService is the payment service's binary, as the fault kit runs it.
var paymentService = testenv.NewProgram("../../cmd/payment-service")

// The fault kit's scenarios against the payment service: the kit's crash
// points, the outbox relay's (after-outbox-publish: published, confirmed,
// not yet marked sent) and its own (after-gateway-charge), replicas killed, connections
// dropped, database sessions terminated, each under the publisher's load
// with duplicates and poison; then inboxctl verify: nothing lost, no order
// charged twice, only the poison dead-lettered.
func TestPaymentUnderFaults(t *testing.T) {
	faultkit.Run(t, faultkit.Scenarios("after-gateway-charge", "after-outbox-publish"), paymentTrial(nil))
}

// The same with the buffered inbox.
func TestPaymentUnderFaultsBuffered(t *testing.T) {
	faultkit.Run(t, faultkit.BufferedScenarios("after-gateway-charge", "after-outbox-publish"), paymentTrial([]string{
		"INBOX_MODE=buffered", "BUFFER_RETRY_DELAYS=200ms,1s,2s", "BUFFER_MAX_ATTEMPTS=30",
		"HANDLER_TIMEOUT=2s", "GATEWAY_TIMEOUT=1s",
	}))
}

// faultSink stands for the shipping service's queue: the OrderPaid events
// the outbox relays are routed there (nobody reads them in these tests).
const faultSink = "faults.order-paid"

func paymentTrial(env []string) func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
	return func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
		amqpURL, paymentsDB, gatewayDB := testenv.VHost(t), testenv.Postgres(t), testenv.Postgres(t)
		gatewayAddr := testenv.FreeAddr(t)
		start(t, "fake-gateway", []string{"DATABASE_URL=" + gatewayDB, "HTTP_ADDR=" + gatewayAddr, "IN_FLIGHT_TAKEOVER=" + inFlightWindow})
		waitHTTP(t, "http://"+gatewayAddr+"/healthz")
		testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare("payments", "topic", true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare(faultSink, true, false, false, false, nil); err != nil {
				return err
			}
			return ch.QueueBind(faultSink, "order.paid", "payments", false, nil)
		})
		s := faultkit.Start(t, faultkit.Config{
			Program: paymentService, Replicas: sc.Replicas, AMQPURL: amqpURL, DBURL: paymentsDB, Sinks: []string{faultSink},
			Env: append([]string{"GATEWAY_URL=http://" + gatewayAddr, "GATEWAY_IN_FLIGHT_TIMEOUT=" + inFlightWindow,
				"RETRY_DELAYS=200ms,1s,2s", "MAX_ATTEMPTS=8", "RECONNECT_MAX_WAIT=2s", "SHUTDOWN_TIMEOUT=5s",
				// A relay that crashed holding rows gives them up after its
				// lease: the shortest the relay takes.
				"OUTBOX_LEASE=16s"}, env...),
		})
		summary := filepath.Join(t.TempDir(), "summary.json")
		return &faultkit.Trial{
			Stack: s,
			Load: func() error {
				code, out := run(t, 4*time.Minute, "order-publisher", []string{"AMQP_URL=" + amqpURL},
					"-count", "300", "-duplicate-rate", "0.1", "-republish-rate", "0.05", "-poison", "3", "-rate", "35", "-summary", summary)
				if code != 0 {
					return fmt.Errorf("order-publisher exited %d:\n%s", code, out)
				}
				return nil
			},
			Progress: func() int { return scalar(t, paymentsDB, "SELECT count(*) FROM payments") },
			Verify: func(t *testing.T) {
				code, out := run(t, time.Minute, "inboxctl", []string{
					"AMQP_URL=" + amqpURL, "DATABASE_URL=" + paymentsDB, "GATEWAY_DATABASE_URL=" + gatewayDB,
					"RETRY_DELAYS=200ms,1s,2s", "MAX_ATTEMPTS=8", "GATEWAY_IN_FLIGHT_TIMEOUT=" + inFlightWindow,
				}, "verify", "--summary", summary)
				if code != 0 || !strings.Contains(out, "PASS: every invariant holds") {
					t.Errorf("inboxctl verify: exit %d\n%s", code, out)
				}
				// The outbox: every succeeded payment's OrderPaid reached the
				// broker (at least once: a relay that crashed between the
				// confirm and marking the row sent publishes it again).
				paid := scalar(t, paymentsDB, "SELECT count(*) FROM payments WHERE status = 'succeeded'")
				if got := distinctIDs(t, amqpURL, faultSink); got != paid {
					t.Errorf("%d distinct OrderPaid events reached %s for %d succeeded payments", got, faultSink, paid)
				}
				if sc.Name == "crash-after-gateway-charge" {
					if n := scalar(t, gatewayDB, "SELECT coalesce(sum(replays), 0) FROM charges"); n == 0 {
						t.Errorf("no charge was replayed after a crash between the charge and the commit")
					}
				}
			},
		}
	}
}

// distinctIDs takes every message of queue and counts their distinct
// message ids.
func distinctIDs(t *testing.T, amqpURL, queue string) int {
	t.Helper()
	ids := map[string]bool{}
	testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				return err
			}
			ids[d.MessageId] = true
		}
	})
	return len(ids)
}
