package payment_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/demo/fakegateway"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/internal/payment/gateway"
	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/wire"
)

// stack is the payment service as cmd/payment-service runs it (its Options,
// the kit's Run, the configuration from the environment), through
// servicetest, against a real broker vhost, a real payments database and the
// fake gateway on its own database. Every replica it starts shares the
// vhost and the database.
type stack struct {
	t         *testing.T
	amqpURL   string
	dbURL     string
	db        *gorm.DB
	gatewayDB *gorm.DB
	gateway   *fakegateway.Server
	gwURL     string
	// Settings of the next service(): retryDelays of 50ms and 100ms, and
	// maxAttempts of 6 and pauseAfter of the kit's default where 0.
	retryDelays             []time.Duration
	maxAttempts, pauseAfter int
	// first is the first replica started: its configuration names the
	// queues; events is the test's queue of what the service emitted.
	first  *kittest.Stack
	events *kittest.Events
	pub    *amqp.Channel
}

func newStack(t *testing.T) *stack {
	t.Helper()
	return newStackWithTakeover(t, 30*time.Second)
}

// newStackWithTakeover is newStack with the gateway's in-flight takeover age.
func newStackWithTakeover(t *testing.T, takeover time.Duration) *stack {
	t.Helper()
	s := &stack{t: t, amqpURL: kittest.VHost(t), retryDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}}
	s.db, s.dbURL = kittest.MigratedDB(t, migrations.Inbox, migrations.Outbox, payment.Migrations)
	s.gatewayDB, _ = kittest.MigratedDB(t, fakegateway.Migrations)
	gw, err := fakegateway.NewServer(s.gatewayDB, prometheus.NewRegistry(), kittest.Logger(t), fakegateway.Faults{},
		fakegateway.Options{InFlightTakeover: takeover})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	s.gateway, s.gwURL = gw, srv.URL
	conn, err := amqp.Dial(s.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if s.pub, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	return s
}

// service starts one replica of the payment service and returns it; the
// first declares the topology, and a queue of the test's is bound to the
// events it emits.
func (s *stack) service() *kittest.Stack {
	s.t.Helper()
	delays := make([]string, len(s.retryDelays))
	for i, d := range s.retryDelays {
		delays[i] = d.String()
	}
	env := []string{
		"AMQP_URL=" + s.amqpURL, "DATABASE_URL=" + s.dbURL, "GATEWAY_URL=" + s.gwURL,
		"PREFETCH=16", "WORKERS=4", "HANDLER_TIMEOUT=5s", "GATEWAY_TIMEOUT=2s", "RECONNECT_MAX_WAIT=1s",
		"QUEUE_DELIVERY_LIMIT=20", "RETRY_DELAYS=" + strings.Join(delays, ","),
		"MAX_ATTEMPTS=" + strconv.Itoa(cmp.Or(s.maxAttempts, 6)), "OUTBOX_POLL_INTERVAL=200ms",
		// The start-up check relates the gateway's in-flight window to the
		// retries; these tests set the fake gateway's window themselves
		// (TestRetriesMustOutlastTheGatewaysInFlightWindow runs retries
		// inside it on purpose), so the variable claims the shortest.
		"GATEWAY_IN_FLIGHT_TIMEOUT=1ms",
	}
	if s.pauseAfter != 0 {
		env = append(env, "PAUSE_AFTER_FAILURES="+strconv.Itoa(s.pauseAfter))
	}
	st := kittest.Start(s.t, payment.Service(), env...)
	if s.first == nil {
		s.first = st
		s.events = st.Bind(payment.ExchangePayments, "#")
	}
	return st
}

func order(id string, amount int64) orders.OrderPlaced {
	return orders.OrderPlaced{
		EventID: "evt-" + id, OrderID: id, CustomerID: "cus-1", AmountCents: amount,
		Currency: "EUR", PlacedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
	}
}

func (s *stack) publish(messageID, contentType string, body []byte) {
	s.t.Helper()
	s.first.Publish(amqp.Publishing{MessageId: messageID, ContentType: contentType, Body: body, Timestamp: time.Now()})
}

func (s *stack) publishOrder(messageID string, o orders.OrderPlaced) {
	s.t.Helper()
	body, err := json.Marshal(o)
	if err != nil {
		s.t.Fatal(err)
	}
	s.publish(messageID, "application/json", body)
}

func count(t *testing.T, db *gorm.DB, table, where string, args ...any) int {
	t.Helper()
	var n int64
	if err := db.Table(table).Where(where, args...).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func outcomes(m *kittest.Stack, outcome string) int { return m.Outcome(kit.Outcome(outcome)) }

func waitOutcome(t *testing.T, m *kittest.Stack, outcome string, n int) {
	t.Helper()
	kittest.Eventually(t, 30*time.Second, fmt.Sprintf("%d %s", n, outcome), func() (bool, error) {
		return outcomes(m, outcome) == n, nil
	})
}

// assertPaidOnce checks one payment and one executed charge for the order.
func (s *stack) assertPaidOnce(orderID string) {
	s.t.Helper()
	if n := count(s.t, s.db, "payments", "order_id = ?", orderID); n != 1 {
		s.t.Errorf("order %s: %d payments, want 1", orderID, n)
	}
	if n := count(s.t, s.gatewayDB, "charges", "order_id = ? AND state = 'completed'", orderID); n != 1 {
		s.t.Errorf("order %s: %d charges, want 1", orderID, n)
	}
}

func TestSameMessageTwice(t *testing.T) {
	s := newStack(t)
	m := s.service()
	s.publishOrder("msg-1", order("o-1", 1250))
	s.publishOrder("msg-1", order("o-1", 1250))
	waitOutcome(t, m, "processed", 1)
	waitOutcome(t, m, "duplicate", 1)
	s.assertPaidOnce("o-1")
}

// A producer retry mints a new message id for the same order.
func TestRepublishedOrderUnderNewID(t *testing.T) {
	s := newStack(t)
	m := s.service()
	s.publishOrder("msg-a", order("o-2", 990))
	waitOutcome(t, m, "processed", 1)
	s.publishOrder("msg-b", order("o-2", 990))
	waitOutcome(t, m, "duplicate", 1)
	s.assertPaidOnce("o-2")
	if n := count(t, s.db, "inbox", "message_id IN ?", []string{"msg-a", "msg-b"}); n != 2 {
		t.Fatalf("inbox rows = %d, want 2 (the duplicate's id is recorded too)", n)
	}
}

// Two replicas get the same message at the same moment, many times over.
func TestConcurrentDeliveryToTwoReplicas(t *testing.T) {
	s := newStack(t)
	a, b := s.service(), s.service()
	const n = 30
	for i := range n {
		o := order(fmt.Sprintf("o-race-%d", i), 1000+100*int64(i)) // never ends in 02: no declines
		s.publishOrder("race-"+o.OrderID, o)
		s.publishOrder("race-"+o.OrderID, o)
	}
	kittest.Eventually(t, 60*time.Second, "all settled", func() (bool, error) {
		return outcomes(a, "processed")+outcomes(b, "processed") == n &&
			outcomes(a, "duplicate")+outcomes(b, "duplicate") == n, nil
	})
	for i := range n {
		s.assertPaidOnce(fmt.Sprintf("o-race-%d", i))
	}
}

// The gateway charges, then loses its response: the retry uses the same
// idempotency key and gets the stored charge replayed, not a second charge.
func TestLostGatewayResponseIsReplayed(t *testing.T) {
	s := newStack(t)
	if err := s.gateway.SetFaults(fakegateway.Faults{LostResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	m := s.service()
	s.publishOrder("msg-lost", order("o-lost", 4200))
	kittest.Eventually(t, 30*time.Second, "charge stored", func() (bool, error) {
		return count(t, s.gatewayDB, "charges", "order_id = ? AND state = 'completed'", "o-lost") == 1, nil
	})
	if err := s.gateway.SetFaults(fakegateway.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitOutcome(t, m, "processed", 1)
	s.assertPaidOnce("o-lost")
	if outcomes(m, "retried") < 1 || count(t, s.gatewayDB, "charges", "order_id = ? AND replays >= 1", "o-lost") != 1 {
		t.Fatal("the charge was not replayed on a retry")
	}
}

// The gateway fails every charge until the message was retried at least
// twice; then it answers, and the next retry pays the order. The retries
// (a second apart, 100 attempts) outlast the poll by far: the message is
// not given up before the gateway is back.
func TestGatewayErrorsAreRetried(t *testing.T) {
	s := newStack(t)
	s.retryDelays, s.maxAttempts = []time.Duration{50 * time.Millisecond, time.Second}, 100
	if err := s.gateway.SetFaults(fakegateway.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	m := s.service()
	s.publishOrder("msg-503", order("o-503", 700))
	// At least: the count may pass 2 between two polls.
	kittest.Eventually(t, 30*time.Second, "2 retried", func() (bool, error) { return outcomes(m, "retried") >= 2, nil })
	if err := s.gateway.SetFaults(fakegateway.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitOutcome(t, m, "processed", 1)
	s.assertPaidOnce("o-503")
}

func TestDeclineIsRecordedAndAcked(t *testing.T) {
	s := newStack(t)
	m := s.service()
	s.publishOrder("msg-dec", order("o-dec", 10002))
	waitOutcome(t, m, "declined", 1)
	var p payment.Payment
	if err := s.db.Where("order_id = ?", "o-dec").Take(&p).Error; err != nil {
		t.Fatal(err)
	}
	if p.Status != payment.StatusDeclined || p.DeclineReason == nil || *p.DeclineReason == "" {
		t.Fatalf("payment %+v, want declined with a reason", p)
	}
}

// A producer that sets no message_id property: the body's event_id is the key.
func TestEventIDInBodyDedupes(t *testing.T) {
	s := newStack(t)
	m := s.service()
	o := order("o-body", 1500)
	s.publishOrder("", o)
	s.publishOrder("", o)
	waitOutcome(t, m, "processed", 1)
	waitOutcome(t, m, "duplicate", 1)
	s.assertPaidOnce("o-body")
	if n := count(t, s.db, "inbox", "message_id = ?", o.EventID); n != 1 {
		t.Fatalf("inbox rows for event id = %d, want 1", n)
	}
}

func TestPoisonMessages(t *testing.T) {
	s := newStack(t)
	m := s.service()
	valid := `{"event_id":"e","order_id":"o","customer_id":"c","amount_cents":100,"currency":"EUR","placed_at":"2026-11-29T12:00:00Z"}`
	tests := []struct {
		name, contentType, body, reason string
		noID                            bool
	}{
		{"truncated", "application/json", valid[:40], orders.ReasonMalformedJSON, false},
		{"non-utf8", "application/json", "{\"event_id\":\"\xff\xfe\"}", orders.ReasonInvalidUTF8, false},
		{"amount-string", "application/json", strings.Replace(valid, "100", `"100"`, 1), orders.ReasonInvalidAmount, false},
		{"amount-float", "application/json", strings.Replace(valid, "100", "100.5", 1), orders.ReasonInvalidAmount, false},
		{"missing-field", "application/json", `{"event_id":"e","order_id":"o"}`, orders.ReasonMissingField, false},
		{"zero-amount", "application/json", strings.Replace(valid, "100", "0", 1), orders.ReasonInvalidAmount, false},
		{"negative-amount", "application/json", strings.Replace(valid, "100", "-5", 1), orders.ReasonInvalidAmount, false},
		{"currency", "application/json", strings.Replace(valid, "EUR", "EURO", 1), orders.ReasonInvalidCurrency, false},
		// No message_id and no event_id: the id was to come from the event,
		// so the Decoder's refusal names the reason.
		{"no-id", "application/json", `{"order_id":"o"}`, orders.ReasonMissingField, true},
		{"oversize", "application/json", `{"pad":"` + strings.Repeat("x", 70000) + `"}`, string(wire.ReasonBodyTooLarge), false},
		{"content-type", "text/plain", valid, string(wire.ReasonUnsupportedContent), false},
		// Valid JSON and UTF-8, but PostgreSQL text refuses NUL: invalid at once, not retried.
		{"nul-in-order-id", "application/json", strings.Replace(valid, `"o"`, `"o\u0000x"`, 1), orders.ReasonInvalidField, false},
	}
	for _, tt := range tests {
		id := "poison-" + tt.name
		if tt.noID {
			id = ""
		}
		s.publish(id, tt.contentType, []byte(tt.body))
	}
	s.publishOrder("after-poison", order("o-after", 300))
	waitOutcome(t, m, "processed", 1)
	waitOutcome(t, m, "dead_lettered", len(tests))
	reasons := s.drainDLQ(len(tests))
	for _, tt := range tests {
		key := "poison-" + tt.name
		if tt.noID {
			key = ""
		}
		if reasons[key] != tt.reason {
			t.Errorf("%s: dead-letter reason %q, want %q", tt.name, reasons[key], tt.reason)
		}
	}
	s.assertPaidOnce("o-after")
}

// An order whose order_id holds a NUL, published without a message_id, is
// refused by the Decoder (invalid_field) although its event_id reads fine:
// the dead letter carries that id as every other does, and so does the log
// line, so dlq list shows it and dlq replay --id reaches it. (It used to go
// without one: "-" in dlq list, out of reach of --id.)
func TestRefusedOrderKeepsItsEventID(t *testing.T) {
	s := newStack(t)
	m := s.service()
	body := `{"event_id":"evt-nul","order_id":"o\u0000x","customer_id":"c","amount_cents":100,"currency":"EUR","placed_at":"2026-11-29T12:00:00Z"}`
	s.publish("", "application/json", []byte(body))
	waitOutcome(t, m, "dead_lettered", 1)
	if !loggedFor(m.Logs.String(), "message dead-lettered", "evt-nul") {
		t.Errorf("no dead-lettering logged with message_id evt-nul:\n%s", m.Logs)
	}
	ctx := context.Background()
	var list bytes.Buffer
	if err := kit.Run(ctx, payment.Service(), []string{"dlq", "list", "--json"}, nil, &list); err != nil {
		t.Fatal(err)
	}
	var listing struct {
		Messages []struct {
			ID     string `json:"message_id"`
			Reason string `json:"reason"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(list.Bytes(), &listing); err != nil {
		t.Fatal(err)
	}
	if len(listing.Messages) != 1 || listing.Messages[0].ID != "evt-nul" || listing.Messages[0].Reason != orders.ReasonInvalidField {
		t.Fatalf("dlq list: %+v, want evt-nul with %s", listing.Messages, orders.ReasonInvalidField)
	}
	// The listing has given its message back, ready, before it returned:
	// the replay right after it finds it.
	var out bytes.Buffer
	if err := kit.Run(ctx, payment.Service(), []string{"dlq", "replay", "--id", "evt-nul"}, nil, &out); err != nil ||
		!strings.Contains(out.String(), "replayed evt-nul") {
		t.Fatalf("dlq replay --id evt-nul: %v\n%s", err, out.String())
	}
	// The replay carries the id as its message_id: refused again, under it.
	waitOutcome(t, m, "dead_lettered", 2)
	if reasons := s.drainDLQ(1); reasons["evt-nul"] != orders.ReasonInvalidField {
		t.Fatalf("after the replay: dead letters %v, want evt-nul with %s", reasons, orders.ReasonInvalidField)
	}
}

// loggedFor reports whether logs hold a JSON line with msg about message id.
func loggedFor(logs, msg, id string) bool {
	for line := range strings.Lines(logs) {
		var l struct {
			Msg       string `json:"msg"`
			MessageID string `json:"message_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.MessageID == id {
			return true
		}
	}
	return false
}

// drainDLQ takes n messages from the dead-letter queue: message id → reason.
func (s *stack) drainDLQ(n int) map[string]string {
	s.t.Helper()
	reasons := map[string]string{}
	kittest.Eventually(s.t, 30*time.Second, "dead letters", func() (bool, error) {
		d, ok, err := s.pub.Get(s.first.Config.DeadLetterQueue, true)
		if ok {
			reasons[d.MessageId] = fmt.Sprint(d.Headers[wire.HeaderDeadLetterReason])
		}
		return len(reasons) == n, err
	})
	return reasons
}

// A gateway that never recovers: the message is dead-lettered after exactly
// the attempt budget, with the attempts and the last error in its headers.
func TestGatewayAlwaysFailingEndsInDeadLetter(t *testing.T) {
	s := newStack(t)
	if err := s.gateway.SetFaults(fakegateway.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	m := s.service()
	s.publishOrder("msg-down", order("o-down", 800))
	waitOutcome(t, m, "dead_lettered", 1)
	var d amqp.Delivery
	kittest.Eventually(t, 30*time.Second, "the dead letter", func() (bool, error) {
		var ok bool
		var err error
		d, ok, err = s.pub.Get(s.first.Config.DeadLetterQueue, true)
		return ok, err
	})
	if d.Headers[wire.HeaderDeadLetterReason] != wire.ReasonRetriesExhausted ||
		fmt.Sprint(d.Headers[wire.HeaderAttempt]) != "6" ||
		!strings.Contains(fmt.Sprint(d.Headers[wire.HeaderDeadLetterError]), "503") {
		t.Fatalf("headers %v: want retries_exhausted after 6 attempts with the 503 error", d.Headers)
	}
	if outcomes(m, "retried") != 5 {
		t.Fatalf("retried %d times, want 5", outcomes(m, "retried"))
	}
	if n := count(t, s.db, "payments", "order_id = ?", "o-down"); n != 0 {
		t.Fatalf("%d payments for a failed order", n)
	}
}

func TestModelMatchesSchema(t *testing.T) {
	db, _ := kittest.MigratedDB(t, migrations.Inbox, payment.Migrations)
	kittest.AssertModelMatchesTable(t, db, &payment.Payment{})
}

// The same order published again under a new message id with another amount
// is a conflict, dead-lettered with its own reason, whether the first is paid
// already or still in flight at the gateway.
func TestConflictingRepublishIsDeadLettered(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		t.Run(fmt.Sprintf("in-flight=%v", inFlight), func(t *testing.T) {
			s := newStack(t)
			m := s.service()
			first, other := order("o-conflict", 1500), order("o-conflict", 2500)
			other.EventID = "evt-other"
			if inFlight {
				if err := s.gateway.SetFaults(fakegateway.Faults{Latency: 700 * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
				s.publishOrder("msg-first", first)
				// The first charge is in flight at the gateway (its row
				// stored, the answer held by the latency) before the other
				// is published: otherwise either could reach it first.
				kittest.Eventually(t, 30*time.Second, "the first charge in flight", func() (bool, error) {
					var n int64
					err := s.gatewayDB.Table("charges").Where("order_id = ?", "o-conflict").Count(&n).Error
					return n == 1, err
				})
				s.publishOrder("msg-other", other)
			} else {
				s.publishOrder("msg-first", first)
				waitOutcome(t, m, "processed", 1)
				s.publishOrder("msg-other", other)
			}
			reasons := s.drainDLQ(1)
			if reasons["msg-other"] != payment.ReasonOrderConflict.String() {
				t.Fatalf("dead letters %v, want msg-other with %s", reasons, payment.ReasonOrderConflict)
			}
			waitOutcome(t, m, "processed", 1)
			s.assertPaidOnce("o-conflict")
			var amount int64
			if err := s.db.Table("payments").Select("amount_cents").Where("order_id = ?", "o-conflict").Scan(&amount).Error; err != nil || amount != 1500 {
				t.Fatalf("paid amount %d (%v), want the first one, 1500", amount, err)
			}
		})
	}
}

// A gateway that refuses every request alike (401 after a key rotation) is
// our configuration's fault, not the messages': the consumer pauses, spends no
// attempt and dead-letters nothing, and pays everything once the gateway
// accepts again.
func TestGatewayMisconfiguredPausesInsteadOfDeadLettering(t *testing.T) {
	s := newStack(t)
	var refuse atomic.Bool
	refuse.Store(true)
	gw := s.gateway.Handler()
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			http.Error(w, `{"error":"invalid API key"}`, http.StatusUnauthorized)
			return
		}
		gw.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	s.gwURL = proxy.URL
	m := s.service()
	const n = 10
	for i := range n {
		s.publishOrder(fmt.Sprintf("m-%d", i), order(fmt.Sprintf("o-401-%d", i), 1000+int64(i)*100))
	}
	kittest.Eventually(t, 30*time.Second, "a pause", func() (bool, error) { return outcomes(m, "requeued") >= 1, nil })
	refuse.Store(false)
	waitOutcome(t, m, "processed", n)
	if outcomes(m, "dead_lettered") != 0 || outcomes(m, "retried") != 0 {
		t.Fatalf("dead-lettered %d, retried %d: want neither", outcomes(m, "dead_lettered"), outcomes(m, "retried"))
	}
	for i := range n {
		s.assertPaidOnce(fmt.Sprintf("o-401-%d", i))
	}
}

// A charge stuck in flight at the gateway answers every retry with 409 until
// the gateway's in-flight window ends and a retry takes it over. Retries all
// spent inside that window dead-letter the message while its charge goes
// through: a card charged, no payment, a dead letter (the start-up check of
// GATEWAY_IN_FLIGHT_TIMEOUT refuses such settings, see
// TestServiceChecksTimeoutRelations). Retries that outlast the window pay the
// order once. The stuck charge is a request to a second, slow gateway process
// over the same charges table: in flight for 6s, longer than every window here.
func TestRetriesMustOutlastTheGatewaysInFlightWindow(t *testing.T) {
	tests := []struct {
		name     string
		takeover time.Duration
		delays   []time.Duration // 5 retries: the last delay repeats
		want     string
	}{
		{"retries spent inside the window", 30 * time.Second, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}, "dead_lettered"},
		// At least 0.8 × (300ms + 4 × 400ms) = 1.52s of retries, above the 1s window.
		{"retries outlast the window", time.Second, []time.Duration{300 * time.Millisecond, 400 * time.Millisecond}, "processed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStackWithTakeover(t, tt.takeover)
			s.retryDelays = tt.delays
			m := s.service()
			o := order("o-stuck", 4200)
			stuck := s.chargeStuckInFlight(o, 6*time.Second)
			s.publishOrder("msg-stuck", o)
			waitOutcome(t, m, tt.want, 1)
			inFlight := count(t, s.gatewayDB, "charges", "order_id = ? AND state = 'in_flight'", o.OrderID)
			if err := <-stuck; err != nil {
				t.Fatalf("the stuck charge: %v", err)
			}
			if n := count(t, s.gatewayDB, "charges", "order_id = ? AND state = 'completed'", o.OrderID); n != 1 {
				t.Fatalf("%d completed charges of the order, want 1", n)
			}
			payments := count(t, s.db, "payments", "order_id = ?", o.OrderID)
			switch tt.want {
			case "dead_lettered":
				if reasons := s.drainDLQ(1); reasons["msg-stuck"] != string(wire.ReasonRetriesExhausted) || payments != 0 || inFlight != 1 {
					t.Fatalf("dead letters %v, %d payments, charge in flight %d: want msg-stuck retries_exhausted while its charge was in flight, and no payment",
						reasons, payments, inFlight)
				}
				if outcomes(m, "retried") != 5 {
					t.Errorf("retried %d times, want 5", outcomes(m, "retried"))
				}
			case "processed":
				s.assertPaidOnce(o.OrderID)
				if outcomes(m, "dead_lettered") != 0 {
					t.Errorf("dead-lettered %d", outcomes(m, "dead_lettered"))
				}
			}
		})
	}
}

// chargeStuckInFlight charges o through a second gateway process over the same
// database whose every request spends latency in flight, and returns once its
// claim is stored; the channel yields the request's error when it ends.
func (s *stack) chargeStuckInFlight(o orders.OrderPlaced, latency time.Duration) <-chan error {
	s.t.Helper()
	slow, err := fakegateway.NewServer(s.gatewayDB, prometheus.NewRegistry(), kittest.Logger(s.t),
		fakegateway.Faults{Latency: latency}, fakegateway.Options{InFlightTakeover: time.Hour})
	if err != nil {
		s.t.Fatal(err)
	}
	srv := httptest.NewServer(slow.Handler())
	s.t.Cleanup(srv.Close)
	done := make(chan error, 1)
	go func() {
		_, err := gateway.NewClient(srv.URL, latency+10*time.Second, 1).Charge(context.Background(), gateway.ChargeRequest{
			IdempotencyKey: payment.IdempotencyKey(o.OrderID), OrderID: o.OrderID, CustomerID: o.CustomerID,
			AmountCents: o.AmountCents, Currency: o.Currency,
		})
		done <- err
	}()
	kittest.Eventually(s.t, 10*time.Second, "the stuck charge's claim", func() (bool, error) {
		return count(s.t, s.gatewayDB, "charges", "order_id = ? AND state = 'in_flight'", o.OrderID) == 1, nil
	})
	return done
}

// The same order republished under a new message id after the gateway forgot
// its key: the recorded payment is found first, and the card is not charged
// again (the gateway would take the forgotten key for a new charge).
func TestRepublishAfterTheGatewayForgotTheKey(t *testing.T) {
	s := newStack(t)
	if err := s.gateway.SetFaults(fakegateway.Faults{KeyTTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	m := s.service()
	s.publishOrder("msg-first", order("o-forgotten", 4200))
	waitOutcome(t, m, "processed", 1)
	time.Sleep(1500 * time.Millisecond) // the gateway forgets the key
	s.publishOrder("msg-later", order("o-forgotten", 4200))
	waitOutcome(t, m, "duplicate", 1)
	if n := count(t, s.gatewayDB, "charges", "order_id = ?", "o-forgotten"); n != 1 {
		t.Fatalf("%d charges for one order, want 1", n)
	}
}

// gatewayDown puts a switch in front of the stack's gateway for the next
// service(): every charge answers 503 until the switch is turned off
// (Store(false)). seen, if not nil, sees each request first.
func (s *stack) gatewayDown(seen func(*http.Request)) *atomic.Bool {
	down := new(atomic.Bool)
	down.Store(true)
	gw := s.gateway.Handler()
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen(r)
		}
		if down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		gw.ServeHTTP(w, r)
	}))
	s.t.Cleanup(proxy.Close)
	s.gwURL = proxy.URL
	return down
}

// The gateway down for every message: after a run of failures the consumer
// pauses instead of spending every message's retry budget, and everything is
// paid once the gateway is back. With the run at 3 failures and 3 attempts a
// message could fail three times before the pause only if it ran three times
// before two others ran once; after the pause, until a success, every
// failure is put back without spending an attempt, that of a message which
// spent two before it too: nothing is dead-lettered.
func TestGatewayDownPausesInsteadOfDeadLettering(t *testing.T) {
	s := newStack(t)
	down := s.gatewayDown(nil)
	s.maxAttempts, s.pauseAfter = 3, 3
	m := s.service()
	const n = 40
	for i := range n {
		s.publishOrder(fmt.Sprintf("d-%d", i), order(fmt.Sprintf("o-down-%d", i), 1000+int64(i)*100))
	}
	// Down through several pauses: each resumption probes the gateway with
	// messages, some of which spent their attempts before the first pause;
	// still down, they go back too.
	kittest.Eventually(t, time.Minute, "several pauses", func() (bool, error) { return outcomes(m, "requeued") >= 3*s.pauseAfter, nil })
	down.Store(false)
	waitOutcome(t, m, "processed", n)
	if outcomes(m, "dead_lettered") != 0 {
		t.Fatalf("dead-lettered %d: a gateway down is not the messages' fault", outcomes(m, "dead_lettered"))
	}
}

// A message that spent its attempts before the run of failures reached its
// bound, and fails again after it while the gateway is still down, is put
// back, not dead-lettered: the failure is the gateway's. The message arrives
// at its last attempt (x-attempt 3 of 3, as its retry queue delivers it)
// once three other orders have failed and the consumer paused.
func TestAMessageThatSpentItsAttemptsIsPutBackOnceTheRunPaused(t *testing.T) {
	s := newStack(t)
	var spent atomic.Int32 // the charge requests of o-spent
	down := s.gatewayDown(func(r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "order-charge:o-spent" {
			spent.Add(1)
		}
	})
	s.maxAttempts, s.pauseAfter = 3, 3
	m := s.service()
	for i := range 3 {
		s.publishOrder(fmt.Sprintf("r-%d", i), order(fmt.Sprintf("o-r-%d", i), 1000+int64(i)*100))
	}
	kittest.Eventually(t, 30*time.Second, "the pause", func() (bool, error) { return outcomes(m, "requeued") >= 1, nil })
	body, err := json.Marshal(order("o-spent", 999))
	if err != nil {
		t.Fatal(err)
	}
	s.first.Publish(amqp.Publishing{MessageId: "spent", ContentType: "application/json", Body: body, Timestamp: time.Now(),
		Headers: amqp.Table{kittest.HeaderAttempt: int32(3)}})
	// Its last attempt fails: put back, it is charged again; dead-lettered,
	// never.
	kittest.Eventually(t, time.Minute, "o-spent tried again, or dead-lettered", func() (bool, error) {
		return spent.Load() >= 2 || outcomes(m, "dead_lettered") > 0, nil
	})
	if n := outcomes(m, "dead_lettered"); n != 0 {
		t.Fatalf("dead-lettered %d: its last attempt failed while the gateway was down, not by its own fault", n)
	}
	down.Store(false)
	waitOutcome(t, m, "processed", 4)
	if n := outcomes(m, "dead_lettered"); n != 0 {
		t.Fatalf("dead-lettered %d once the gateway was back", n)
	}
}

// Each payment recorded emits its event through the outbox, in the same
// transaction: OrderPaid (with the order's shipping address) for a charge,
// PaymentDeclined for a decline, nothing for a duplicate of the order. Each
// event's message_id is its outbox row's id.
func TestPaymentsEmitTheirEvents(t *testing.T) {
	s := newStack(t)
	m := s.service()
	paid := order("o-paid", 4200)
	paid.ShippingAddress = "1 Demo Street, Berlin"
	s.publishOrder("m-paid", paid)
	s.publishOrder("m-paid-again", paid) // the same order under another id
	s.publishOrder("m-declined", order("o-declined", 1002))
	waitOutcome(t, m, "processed", 1)
	waitOutcome(t, m, "declined", 1)
	waitOutcome(t, m, "duplicate", 1)
	events := s.events.Take(2)
	// Each event is written with its payment, in its transaction: the
	// outbox holds every event the three messages made.
	if n := count(t, s.db, "outbox", "true"); n != 2 || s.events.Waiting() != 0 {
		t.Fatalf("%d outbox rows and %d more events: want two, the duplicate emitting none", n, s.events.Waiting())
	}
	byKey := map[string]amqp.Delivery{}
	for _, d := range events {
		byKey[d.RoutingKey] = d
	}
	var op payment.OrderPaid
	if err := json.Unmarshal(byKey[payment.KeyOrderPaid].Body, &op); err != nil || op.OrderID != "o-paid" ||
		op.Address != paid.ShippingAddress || op.AmountCents != 4200 || op.ChargeID == "" {
		t.Errorf("OrderPaid %s (%v)", byKey[payment.KeyOrderPaid].Body, err)
	}
	var pd payment.PaymentDeclined
	if err := json.Unmarshal(byKey[payment.KeyPaymentDeclined].Body, &pd); err != nil || pd.OrderID != "o-declined" || pd.DeclineReason == "" {
		t.Errorf("PaymentDeclined %s (%v)", byKey[payment.KeyPaymentDeclined].Body, err)
	}
	for _, d := range events {
		kittest.Eventually(t, 10*time.Second, "its outbox row marked sent", func() (bool, error) {
			return count(t, s.db, "outbox", "id = ? AND status = 'sent'", d.MessageId) == 1, nil
		})
	}
}

// The payment handler's writes pass the harness's check: run once rolled
// back and once committed, they give the same outcome, and only the
// committed run leaves a payment and its event; the card is charged once.
func TestPaymentWritesMayRunTwice(t *testing.T) {
	s := newStack(t)
	h := payment.NewHandler(gateway.NewClient(s.gwURL, 2*time.Second, 8), database.NewReader(s.db), kittest.Outbox(payment.Service()))
	for _, c := range []struct {
		order orders.OrderPlaced
		want  kit.Outcome
	}{
		{order("o-twice", 1250), kit.OutcomeProcessed},
		{order("o-twice-declined", 1002), "declined"},
	} {
		body, err := json.Marshal(c.order)
		if err != nil {
			t.Fatal(err)
		}
		out, err := kittest.CheckWrites(t, s.db, payment.Events, h, kit.Message{ID: "m-" + c.order.OrderID, Body: body, Attempt: 1})
		if err != nil || out != c.want {
			t.Fatalf("order %s: %q, %v; want %q", c.order.OrderID, out, err, c.want)
		}
		if n := count(t, s.db, "payments", "order_id = ?", c.order.OrderID); n != 1 {
			t.Errorf("order %s: %d payments, want the committed run's 1", c.order.OrderID, n)
		}
		if n := count(t, s.db, "outbox", "convert_from(body, 'UTF8')::jsonb->>'order_id' = ?", c.order.OrderID); n != 1 {
			t.Errorf("order %s: %d outbox rows, want the committed run's 1", c.order.OrderID, n)
		}
		if n := count(t, s.gatewayDB, "charges", "order_id = ?", c.order.OrderID); n != 1 {
			t.Errorf("order %s: %d charges, want 1", c.order.OrderID, n)
		}
	}
}
