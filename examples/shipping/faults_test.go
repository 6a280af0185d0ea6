package shipping_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/kittest/faultkit"
)

// The fault kit's scenarios against the shipping service: the kit's crash
// points and its own (after-carrier-book), replicas killed, connections
// dropped, database sessions terminated, each under a load with duplicates,
// republishes and a poison message. After each, every order is shipped once
// and booked once, and only the poison is dead-lettered.
//
// The two modes' tests run side by side (none of the catalogue's scenarios
// disturbs the whole broker).
func TestShippingUnderFaults(t *testing.T) {
	t.Parallel()
	faultkit.Run(t, faultkit.Scenarios("after-carrier-book"), shippingTrial(nil))
}

// The same with the buffered inbox.
func TestShippingUnderFaultsBuffered(t *testing.T) {
	t.Parallel()
	faultkit.Run(t, faultkit.BufferedScenarios("after-carrier-book"),
		shippingTrial([]string{"INBOX_MODE=buffered", "BUFFER_RETRY_DELAYS=200ms,1s,2s", "BUFFER_MAX_ATTEMPTS=30", "HANDLER_TIMEOUT=2s", "CARRIER_TIMEOUT=1s"}))
}

// faultOrders is the load of one trial: orders, each paid once, a tenth of
// them published twice (the producer's duplicate) and a twentieth again
// under a new message id (a republish), and one poison message.
const faultOrders = 300

func faultLoad() []amqp.Publishing {
	var msgs []amqp.Publishing
	for i := range faultOrders {
		order := fmt.Sprintf("o-%d", i)
		msgs = append(msgs, paid("m-"+order, order))
		if i%10 == 0 {
			msgs = append(msgs, paid("m-"+order, order))
		}
		if i%20 == 0 {
			msgs = append(msgs, paid("again-"+order, order))
		}
		if i == faultOrders/2 {
			msgs = append(msgs, amqp.Publishing{MessageId: "poison", Body: []byte(`{"order_id":`)})
		}
	}
	return msgs
}

func shippingTrial(env []string) func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
	return func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
		c := &carrier{booked: map[string]string{}}
		srv := httptest.NewServer(c)
		t.Cleanup(srv.Close)
		amqpURL, dbURL := kittest.VHost(t), kittest.Postgres(t)
		s := faultkit.Start(t, faultkit.Config{
			Program: service, Replicas: sc.Replicas, AMQPURL: amqpURL, DBURL: dbURL,
			Env: append([]string{"CARRIER_URL=" + srv.URL, "RETRY_DELAYS=200ms,1s,2s", "MAX_ATTEMPTS=8", "CARRIER_IN_FLIGHT_TIMEOUT=1s",
				"RECONNECT_MAX_WAIT=2s", "SHUTDOWN_TIMEOUT=5s"}, env...),
		})
		shipments := func() int { return kittest.Count(t, dbURL, "SELECT count(*) FROM shipments") }
		orders := faultOrders // with the batches of LoadMore
		return &faultkit.Trial{
			Stack: s,
			Load: func() error {
				return faultkit.Publish(amqpURL, "payments", "order.paid", faultLoad(), 35, 3*time.Minute)
			},
			// While the fault's rounds remain: 2 s more of orders, each once.
			LoadMore: func() error {
				var msgs []amqp.Publishing
				for range 70 {
					order := fmt.Sprintf("o-%d", orders)
					msgs = append(msgs, paid("m-"+order, order))
					orders++
				}
				return faultkit.Publish(amqpURL, "payments", "order.paid", msgs, 35, 3*time.Minute)
			},
			Progress: shipments,
			Verify: func(t *testing.T) {
				if n := shipments(); n != orders {
					t.Errorf("%d shipments for %d orders", n, orders)
				}
				booked, replays := c.counts()
				if booked != orders {
					t.Errorf("%d pickups booked for %d orders", booked, orders)
				}
				if sc.Name == "crash-after-carrier-book" && replays == 0 {
					t.Errorf("no booking was asked again after a crash between the booking and the commit")
				}
				if n := kittest.Count(t, dbURL, "SELECT count(DISTINCT order_id) FROM shipments"); n != orders {
					t.Errorf("%d distinct orders shipped, want %d", n, orders)
				}
				assertPoisonAloneGivenUp(t, amqpURL, dbURL)
			},
		}
	}
}

// assertPoisonAloneGivenUp checks that the poison, and nothing else, was
// given up on: dead-lettered inline, parked in the buffered mode.
func assertPoisonAloneGivenUp(t *testing.T, amqpURL, dbURL string) {
	t.Helper()
	dlq := "shipping-service.order-paid.dlq"
	dead := kittest.QueueDepth(t, amqpURL, dlq)
	parked := kittest.Count(t, dbURL, "SELECT count(*) FROM inbox_messages WHERE status = 'parked'")
	if dead+parked != 1 {
		t.Fatalf("%d dead letters and %d parked messages, want the poison alone", dead, parked)
	}
	if parked == 1 {
		if n := kittest.Count(t, dbURL, "SELECT count(*) FROM inbox_messages WHERE status = 'parked' AND message_id = 'poison' AND park_reason = 'malformed_json'"); n != 1 {
			t.Errorf("the parked message is not the poison with malformed_json")
		}
		return
	}
	kittest.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get(dlq, false)
		if err == nil && ok && (d.MessageId != "poison" || d.Headers[kittest.HeaderDeadLetterReason] != "malformed_json") {
			t.Errorf("dead letter %q with reason %v, want the poison with malformed_json", d.MessageId, d.Headers[kittest.HeaderDeadLetterReason])
		}
		return err
	})
}

// The scenarios' checks fail when the fault did not happen: a crash point
// that never fires (armed with a vanishing probability), and faults
// injected after the load ended.
func TestFaultChecksFailWhenTheFaultDidNotHappen(t *testing.T) {
	never := faultkit.CrashAt("after-commit", 1e-9)
	tr := shippingTrial(nil)(t, never)
	if err := tr.Load(); err != nil {
		t.Fatal(err)
	}
	tr.Stack.Drain(time.Minute, tr.Progress)
	idle := func() bool { return false } // the load is over
	never.Fault(tr.Stack, idle)
	rec := &kittest.Recorder{TB: t}
	never.Check(rec, tr.Stack)
	if len(rec.Errors) == 0 {
		t.Error("CrashAt's check passed although the crash point never fired")
	}
	for _, sc := range []faultkit.Scenario{faultkit.SIGKILLReplicas, faultkit.BrokerDropsConnections, faultkit.DatabaseSessionsTerminated} {
		sc.Fault(tr.Stack, idle)
		rec := &kittest.Recorder{TB: t}
		sc.Check(rec, tr.Stack)
		if len(rec.Errors) == 0 {
			t.Errorf("%s's check passed with no fault injected under load", sc.Name)
		}
	}
}
