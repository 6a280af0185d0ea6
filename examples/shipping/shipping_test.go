package shipping_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/examples/shipping"
	"github.com/inbox-template/payment-service/internal/demo/fakecarrier"
	"github.com/inbox-template/payment-service/kit/kittest"
)

// service is the example's main, built once and run as a process by each test.
var service = kittest.NewProgram("../../cmd/shipping-service")

func TestMain(m *testing.M) { os.Exit(kittest.RunMain(m)) }

// carrier is a pickup API with idempotency keys: the same key gets the stored
// answer; it counts the pickups it really booked.
type carrier struct {
	mu      sync.Mutex
	booked  map[string]string // key → pickup id
	replays int
}

func (c *carrier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var p struct {
		OrderID string `json:"order_id"`
	}
	if key == "" || json.NewDecoder(r.Body).Decode(&p) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	id, ok := c.booked[key]
	if ok {
		c.replays++
	} else {
		id = "pickup-" + p.OrderID
		c.booked[key] = id
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"pickup_id":%q}`, id)
}

func (c *carrier) counts() (booked, replays int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.booked), c.replays
}

// stack is a vhost, a database, the carrier and the running service.
type stack struct {
	amqpURL, dbURL string
	carrier        *carrier
	proc           *kittest.Process
}

func startStack(t *testing.T) *stack {
	t.Helper()
	c := &carrier{booked: map[string]string{}}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	s := &stack{amqpURL: kittest.VHost(t), dbURL: kittest.Postgres(t), carrier: c}
	s.proc = service.Start(t, "AMQP_URL="+s.amqpURL, "DATABASE_URL="+s.dbURL, "CARRIER_URL="+srv.URL, "RETRY_DELAYS=100ms,500ms",
		"CARRIER_IN_FLIGHT_TIMEOUT=1ms") // this carrier answers at once: nothing stays in flight
	return s
}

// publish sends OrderPaid events with confirms to the exchange the service binds.
func (s *stack) publish(t *testing.T, msgs ...amqp.Publishing) {
	kittest.Publish(t, s.amqpURL, "payments", "order.paid", msgs...)
}

func paid(id, order string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, `{"event_id":%q,"order_id":%q,"address":"1 Main St"}`, id, order)}
}

// The service's second event: each declined order recorded once, under its
// own binding, in the same inbox and queues; nothing booked for it; a
// malformed one dead-lettered with its reason, naming its routing key.
func TestRecordsEachDeclinedOrderOnceAndShipsNothing(t *testing.T) {
	s := startStack(t)
	declined := func(id, order string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, `{"event_id":%q,"order_id":%q,"decline_reason":"insufficient_funds"}`, id, order)}
	}
	var msgs []amqp.Publishing
	for i := range 10 {
		order := fmt.Sprintf("d-%d", i)
		msgs = append(msgs, declined("m-"+order, order), declined("m-"+order, order), declined("again-"+order, order))
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "no-order", Body: []byte(`{"event_id":"e"}`)})
	kittest.Publish(t, s.amqpURL, "payments", "payment.declined", msgs...)
	s.publish(t, paid("m-o-1", "o-1"))
	kittest.Eventually(t, time.Minute, "10 declined orders, 1 shipment, the malformed one dead-lettered", func() (bool, error) {
		return kittest.Count(t, s.dbURL, "SELECT count(*) FROM declined_orders") == 10 &&
			kittest.Count(t, s.dbURL, "SELECT count(*) FROM shipments") == 1 &&
			kittest.QueueDepth(t, s.amqpURL, "shipping-service.order-paid.dlq") == 1 &&
			kittest.Count(t, s.dbURL, "SELECT count(*) FROM inbox WHERE consumer = 'shipping-service'") == 21, nil
	})
	if booked, _ := s.carrier.counts(); booked != 1 {
		t.Errorf("%d pickups booked, want the paid order's alone", booked)
	}
	out, err := s.proc.Command(t, "dlq", "list")
	if err != nil || !strings.Contains(out, "no-order") || !strings.Contains(out, "payment.declined") || !strings.Contains(out, "missing_field") {
		t.Errorf("dlq list: %v, want the malformed decline, its routing key and missing_field:\n%s", err, out)
	}
}

// Duplicates (same message id), the same order under a new message id and a
// poison message: one shipment and one booking per order, the poison in the
// derived dead-letter queue with its reason.
func TestShipsEachOrderOnce(t *testing.T) {
	s := startStack(t)
	var msgs []amqp.Publishing
	for i := range 20 {
		order := fmt.Sprintf("o-%d", i)
		msgs = append(msgs, paid("m-"+order, order), paid("m-"+order, order)) // a producer's duplicate
		if i < 5 {
			msgs = append(msgs, paid("again-"+order, order)) // the same order, a new message id
		}
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "poison", Body: []byte(`{"order_id":`)})
	s.publish(t, msgs...)

	// Every message settled: the shipments, the dead letter, and the inbox
	// rows of the republished ones (they ship nothing: the shipments can be
	// all there while the last of them are still in a worker).
	kittest.Eventually(t, time.Minute, "20 shipments, the poison dead-lettered and 25 inbox rows", func() (bool, error) {
		return kittest.Count(t, s.dbURL, "SELECT count(*) FROM shipments") == 20 &&
			kittest.QueueDepth(t, s.amqpURL, "shipping-service.order-paid.dlq") == 1 &&
			kittest.QueueDepth(t, s.amqpURL, "shipping-service.order-paid") == 0 &&
			kittest.Count(t, s.dbURL, "SELECT count(*) FROM inbox WHERE consumer = 'shipping-service'") >= 25, nil
	})
	if booked, _ := s.carrier.counts(); booked != 20 {
		t.Errorf("%d pickups booked for 20 orders", booked)
	}
	if n := kittest.Count(t, s.dbURL, "SELECT count(*) FROM inbox WHERE consumer = 'shipping-service'"); n != 25 {
		t.Errorf("%d inbox rows, want 25 (one per message id but the poison)", n)
	}
	// The service's own operations commands, from its own configuration.
	out, err := s.proc.Command(t, "dlq", "list")
	if err != nil || !strings.Contains(out, "shipping-service.order-paid.dlq: 1 messages") || !strings.Contains(out, "malformed_json") {
		t.Errorf("shipping-service dlq list: %v\n%s", err, out)
	}
	kittest.WithChannel(t, s.amqpURL, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get("shipping-service.order-paid.dlq", true)
		if err == nil && (!ok || d.MessageId != "poison" || d.Headers[kittest.HeaderDeadLetterReason] != "malformed_json") {
			t.Errorf("dead letter %q with reason %v, want poison with malformed_json", d.MessageId, d.Headers[kittest.HeaderDeadLetterReason])
		}
		return err
	})
}

// The service's own crash point: the process dies after the carrier booked
// the pickup and before anything was committed; after a restart the redelivery
// books with the same key and the carrier replays its answer.
func TestCrashAfterCarrierBook(t *testing.T) {
	s := startStack(t)
	// Armed for every message (probability 1): the first booking kills it.
	s.proc.ArmCrashWith(t, "after-carrier-book", 1)
	if s.proc.Exited() {
		t.Fatal("the service exited before any message")
	}
	var msgs []amqp.Publishing
	for i := range 10 {
		msgs = append(msgs, paid(fmt.Sprintf("c-%d", i), fmt.Sprintf("co-%d", i)))
	}
	s.publish(t, msgs...)
	if code := s.proc.Wait(t, time.Minute); code != kittest.CrashExitCode {
		t.Fatalf("exit status %d, want %d of a crash point", code, kittest.CrashExitCode)
	}
	if !strings.Contains(s.proc.Out.String(), "crash point after-carrier-book") {
		t.Fatal("the process did not die at after-carrier-book")
	}
	s.proc.Restart(t)
	kittest.Eventually(t, time.Minute, "10 shipments after the restart", func() (bool, error) {
		return kittest.Count(t, s.dbURL, "SELECT count(*) FROM shipments") == 10, nil
	})
	booked, replays := s.carrier.counts()
	if booked != 10 || replays < 1 {
		t.Fatalf("%d booked, %d replays: want 10 bookings, the crashed one replayed", booked, replays)
	}
	// The restarted process is not armed: it applied what was left, and its
	// metrics say so.
	if s.proc.Exited() || s.proc.Metric(t, "consumer_messages_total", "outcome", "processed") < 1 {
		t.Errorf("after the restart: exited %v, processed %v; want running, at least 1",
			s.proc.Exited(), s.proc.Metric(t, "consumer_messages_total", "outcome", "processed"))
	}
}

// A booking whose answer the service stopped waiting for (CARRIER_TIMEOUT)
// is still in flight at the carrier, the demo's real one: each retry meets
// 409 until the first request completes, then gets its answer. The order is
// shipped once with the pickup the carrier booked; before, the 409 was taken
// for the request's own fault and the order dead-lettered with its pickup
// booked (a fresh-clone run of the Compose crash demo caught it).
func TestBookingStillInFlightIsRetriedNotDeadLettered(t *testing.T) {
	carrierDB, _ := kittest.MigratedDB(t, fakecarrier.Migrations)
	sqlDB, err := carrierDB.DB()
	if err != nil {
		t.Fatal(err)
	}
	// Each new booking spends 5 s in flight; the service waits 500 ms, and
	// its first retry comes about 300 ms later.
	carrier, err := fakecarrier.NewServer(sqlDB, fakecarrier.Faults{Latency: 5 * time.Second}, 8*time.Second, kittest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(carrier.Handler())
	t.Cleanup(srv.Close)
	s := &stack{amqpURL: kittest.VHost(t), dbURL: kittest.Postgres(t)}
	s.proc = service.Start(t, "AMQP_URL="+s.amqpURL, "DATABASE_URL="+s.dbURL, "CARRIER_URL="+srv.URL,
		"CARRIER_TIMEOUT=500ms", "CARRIER_IN_FLIGHT_TIMEOUT=8s", "RETRY_DELAYS=300ms,1s", "MAX_ATTEMPTS=14")
	const orders = 3
	var msgs []amqp.Publishing
	for i := range orders {
		msgs = append(msgs, paid(fmt.Sprintf("f-%d", i), fmt.Sprintf("fo-%d", i)))
	}
	s.publish(t, msgs...)

	dlq := "shipping-service.order-paid.dlq"
	kittest.Reaches(t, time.Minute, "every order shipped or dead-lettered", orders, func() (int, error) {
		return kittest.Count(t, s.dbURL, "SELECT count(*) FROM shipments") + kittest.QueueDepth(t, s.amqpURL, dlq), nil
	})
	if n := kittest.Count(t, s.dbURL, "SELECT count(*) FROM shipments"); n > orders {
		t.Errorf("%d shipments for %d orders", n, orders)
	}
	if !strings.Contains(s.proc.Logs(), "carrier answered 409") {
		t.Fatalf("no retry met the booking in flight (409): the test proved nothing\n%s", s.proc.Logs())
	}
	if n := kittest.QueueDepth(t, s.amqpURL, dlq); n != 0 {
		t.Fatalf("%d orders dead-lettered while their bookings were in flight at the carrier", n)
	}
	var booked []struct{ OrderID, PickupID string }
	if err := carrierDB.Raw(`SELECT order_id, pickup_id FROM pickups WHERE state = 'completed'`).Scan(&booked).Error; err != nil {
		t.Fatal(err)
	}
	if len(booked) != orders {
		t.Fatalf("the carrier booked %d pickups for %d orders", len(booked), orders)
	}
	for _, b := range booked {
		if n := kittest.Count(t, s.dbURL, "SELECT count(*) FROM shipments WHERE order_id = $1 AND pickup_id = $2", b.OrderID, b.PickupID); n != 1 {
			t.Errorf("order %s: %d shipments with the pickup the carrier booked (%s), want 1", b.OrderID, n, b.PickupID)
		}
	}
}

// The carrier's in-flight window is checked against the retries at start, as
// the gateway's is in the payment service: retries all spent inside it would
// dead-letter an order whose pickup the carrier may still book.
func TestRetriesMustOutlastTheCarriersInFlightWindow(t *testing.T) {
	t.Setenv("RETRY_DELAYS", "1s")
	t.Setenv("MAX_ATTEMPTS", "3")
	if _, err := kittest.LoadConfig(shipping.Service()); err == nil || !strings.Contains(err.Error(), "CARRIER_IN_FLIGHT_TIMEOUT: is 30s") {
		t.Fatalf("err = %v, want CARRIER_IN_FLIGHT_TIMEOUT named", err)
	}
	t.Setenv("CARRIER_IN_FLIGHT_TIMEOUT", "1s")
	if _, err := kittest.LoadConfig(shipping.Service()); err != nil {
		t.Fatalf("retries of 1s, 1s outlast a 1s window: %v", err)
	}
}
