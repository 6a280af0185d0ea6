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

	"github.com/inbox-template/payment-service/internal/kit/faults"
	"github.com/inbox-template/payment-service/internal/kit/testenv"
	"github.com/inbox-template/payment-service/internal/kit/wire"
)

// service is the example's main, built once and run as a process by each test.
var service = testenv.NewProgram("../../cmd/shipping-service")

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }

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
	proc           *testenv.Process
}

func startStack(t *testing.T) *stack {
	t.Helper()
	c := &carrier{booked: map[string]string{}}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	s := &stack{amqpURL: testenv.VHost(t), dbURL: testenv.Postgres(t), carrier: c}
	s.proc = service.Start(t, "AMQP_URL="+s.amqpURL, "DATABASE_URL="+s.dbURL, "CARRIER_URL="+srv.URL, "RETRY_DELAYS=100ms,500ms")
	return s
}

// publish sends OrderPaid events with confirms to the exchange the service binds.
func (s *stack) publish(t *testing.T, msgs ...amqp.Publishing) {
	testenv.Publish(t, s.amqpURL, "payments", "order.paid", msgs...)
}

func paid(id, order string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, `{"event_id":%q,"order_id":%q,"address":"1 Main St"}`, id, order)}
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

	testenv.Eventually(t, time.Minute, "20 shipments and the poison dead-lettered", func() (bool, error) {
		return testenv.Count(t, s.dbURL, "SELECT count(*) FROM shipments") == 20 &&
			testenv.QueueDepth(t, s.amqpURL, "shipping-service.order-paid.dlq") == 1 &&
			testenv.QueueDepth(t, s.amqpURL, "shipping-service.order-paid") == 0, nil
	})
	if booked, _ := s.carrier.counts(); booked != 20 {
		t.Errorf("%d pickups booked for 20 orders", booked)
	}
	if n := testenv.Count(t, s.dbURL, "SELECT count(*) FROM inbox WHERE consumer = 'shipping-service'"); n != 25 {
		t.Errorf("%d inbox rows, want 25 (one per message id but the poison)", n)
	}
	// The service's own operations commands, from its own configuration.
	out, err := s.proc.Command(t, "dlq", "list")
	if err != nil || !strings.Contains(out, "shipping-service.order-paid.dlq: 1 messages") || !strings.Contains(out, "malformed_json") {
		t.Errorf("shipping-service dlq list: %v\n%s", err, out)
	}
	testenv.WithChannel(t, s.amqpURL, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get("shipping-service.order-paid.dlq", true)
		if err == nil && (!ok || d.MessageId != "poison" || d.Headers[wire.HeaderDeadLetterReason] != "malformed_json") {
			t.Errorf("dead letter %q with reason %v, want poison with malformed_json", d.MessageId, d.Headers[wire.HeaderDeadLetterReason])
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
	if code := s.proc.Wait(t, time.Minute); code != faults.ExitCode {
		t.Fatalf("exit status %d, want %d of a crash point", code, faults.ExitCode)
	}
	if !strings.Contains(s.proc.Out.String(), "crash point after-carrier-book") {
		t.Fatal("the process did not die at after-carrier-book")
	}
	s.proc.Restart(t)
	testenv.Eventually(t, time.Minute, "10 shipments after the restart", func() (bool, error) {
		return testenv.Count(t, s.dbURL, "SELECT count(*) FROM shipments") == 10, nil
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
