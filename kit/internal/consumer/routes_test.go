package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// The broker's topic matching, as the routes apply it to a message's key.
func TestTopicMatchesAsTheBrokerRoutes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, key string
		want         bool
	}{
		{"order.placed", "order.placed", true},
		{"order.placed", "order.cancelled", false},
		{"order.placed", "order.placed.eu", false},
		{"order.*", "order.placed", true},
		{"order.*", "order", false},
		{"order.*", "order.placed.eu", false},
		{"order.#", "order", true},
		{"order.#", "order.placed.eu", true},
		{"#", "anything.at.all", true},
		{"#.eu", "order.placed.eu", true},
		{"#.eu", "order.placed.us", false},
		{"*.placed.#", "order.placed", true},
		{"*.placed.#", "placed", false},
		{"a.#.b", "a.b", true},
		{"a.#.b", "a.x.y.b", true},
		{"a.#.b", "a.x.y.c", false},
		{"#", "", true},
		{"*", "", false},
		{"order.#", "", false},
	} {
		if got := TopicMatches(tc.pattern, tc.key); got != tc.want {
			t.Errorf("TopicMatches(%q, %q) = %v, want %v", tc.pattern, tc.key, got, tc.want)
		}
	}
}

// A message's origin is where it was published: a delivery through an
// exchange shows it, whatever its headers say (a producer's header, an
// upstream queue's x-death); a copy through the default exchange carries
// it in headers of the kit's own. An x-death alone does not say it for a
// live delivery (a producer may publish one straight to the queue); a
// replay reads it from a broker's own dead letter (DeathOrigin).
func TestTheOriginOfACopyIsTheOriginalOne(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		d            amqp.Delivery
		exchange, rk string
	}{
		{"published", amqp.Delivery{Exchange: "orders", RoutingKey: "order.cancelled"}, "orders", "order.cancelled"},
		{"published with a producer's header", amqp.Delivery{Exchange: "orders", RoutingKey: "order.placed",
			Headers: amqp.Table{wire.HeaderOriginalExchange: "orders", wire.HeaderOriginalKey: "order.cancelled"}}, "orders", "order.placed"},
		{"dead-lettered into the exchange by an upstream delay queue", amqp.Delivery{Exchange: "orders", RoutingKey: "order.cancelled",
			Headers: amqp.Table{"x-death": []any{amqp.Table{"queue": "delay", "exchange": "", "routing-keys": []any{"delay"}}}}}, "orders", "order.cancelled"},
		{"a retry", amqp.Delivery{RoutingKey: "work",
			Headers: amqp.Table{wire.HeaderOriginalExchange: "orders", wire.HeaderOriginalKey: "order.cancelled"}}, "orders", "order.cancelled"},
		{"straight to the queue with an x-death", amqp.Delivery{RoutingKey: "work", Headers: amqp.Table{"x-death": []any{
			amqp.Table{"queue": "work", "exchange": "orders", "routing-keys": []any{"order.cancelled"}},
		}}}, "", "work"},
		{"straight to the queue", amqp.Delivery{RoutingKey: "work", Headers: amqp.Table{"x-death": []any{"what"}}}, "", "work"},
	} {
		if ex, rk, _ := rabbit.Origin(tc.d); ex != tc.exchange || rk != tc.rk {
			t.Errorf("%s: origin %s %q, want %s %q", tc.name, ex, rk, tc.exchange, tc.rk)
		}
	}
	for _, tc := range []struct {
		name         string
		h            amqp.Table
		exchange, rk string
	}{
		{"a broker's dead letter", amqp.Table{"x-death": []any{
			amqp.Table{"queue": "work", "routing-keys": []any{"work"}},
			amqp.Table{"queue": "work", "exchange": "orders", "routing-keys": []any{"order.cancelled"}},
		}}, "orders", "order.cancelled"},
		{"rejected at the work queue after an upstream delay queue", amqp.Table{"x-death": []any{
			amqp.Table{"queue": "work", "exchange": "orders", "routing-keys": []any{"order.cancelled"}},
			amqp.Table{"queue": "delay", "exchange": "delays", "routing-keys": []any{"later.cancel"}},
		}}, "orders", "order.cancelled"},
		{"a retry copy without the kit's headers (v0.3.0)", amqp.Table{"x-death": []any{
			amqp.Table{"queue": "work.retry.1s", "exchange": "", "routing-keys": []any{"work.retry.1s"}},
		}}, "", ""},
	} {
		if ex, rk, _ := rabbit.DeathOrigin(tc.h); ex != tc.exchange || rk != tc.rk {
			t.Errorf("%s: death origin %s %q, want %s %q", tc.name, ex, rk, tc.exchange, tc.rk)
		}
	}
}

// A pattern covers another when it matches every key the other does: a
// binding behind one that covers it is never reached.
func TestTopicCoversWhatItShadows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p, q string
		want bool
	}{
		{"order.#", "order.cancelled", true},
		{"order.#", "order.*", true},
		{"order.#", "order.#", true},
		{"#", "a.*.#", true},
		{"order.*", "order.cancelled", true},
		{"order.*", "order.#", false},
		{"order.*", "order.*.eu", false},
		{"order.placed", "order.*", false},
		{"*.placed", "order.#", false},
		{"order.*.eu", "order.placed.*", false},
	} {
		if got := TopicCovers(tc.p, tc.q); got != tc.want {
			t.Errorf("TopicCovers(%q, %q) = %v, want %v", tc.p, tc.q, got, tc.want)
		}
	}
}

type cancelledEvent decodedEvent

func cancelledEvents() Events[cancelledEvent] {
	return Events[cancelledEvent]{
		Decode: func(body []byte) (cancelledEvent, error) {
			var ev cancelledEvent
			return ev, json.Unmarshal(body, &ev)
		},
		OrderingKey: func(e cancelledEvent) string { return e.Key },
	}
}

// Routed refuses what would route a message two ways, or nowhere.
func TestRoutedRefusesAmbiguousRoutes(t *testing.T) {
	t.Parallel()
	var decodes atomic.Int64
	placed, h := countingEvents(&decodes), HandlerFunc(func(context.Context, Message) (Writes, error) { return nil, nil })
	for _, tc := range []struct {
		routes []Route
		want   string
	}{
		{[]Route{{"orders", "order.placed", placed, h}, {"orders", "order.placed", cancelledEvents(), h}}, "given twice"},
		{[]Route{{"orders", "order.placed", placed, h}, {"orders", "order.other", placed, h}}, "both decode"},
		{[]Route{{"orders", "order.placed", placed, h}, {"orders", "", cancelledEvents(), h}}, "1 to 255 bytes"},
		{[]Route{{"orders", "order.placed", placed, h}, {"", "order.cancelled", cancelledEvents(), h}}, "no exchange"},
		{[]Route{{"orders", "order.placed", placed, h}, {"orders", "order.cancelled", nil, h}}, "no Decoder"},
		{[]Route{{"orders", "order.placed", placed, h}, {"orders", "order.cancelled", cancelledEvents(), nil}}, "no Handler"},
		{[]Route{{"orders", "order.#", placed, h}, {"orders", "order.cancelled", cancelledEvents(), h}}, "never reached"},
		{[]Route{{"orders", "order.#", placed, h}, {"orders", "order.*", cancelledEvents(), h}}, "never reached"},
		{nil, "no routes"},
	} {
		if _, _, err := Routed(tc.routes); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Routed(%d routes): %v, want an error saying %q", len(tc.routes), err, tc.want)
		}
	}
	// The same key on two exchanges is two bindings.
	if _, _, err := Routed([]Route{{"orders", "order.#", placed, h}, {"payments", "order.cancelled", cancelledEvents(), h}}); err != nil {
		t.Errorf("the same key on another exchange: %v", err)
	}
}

// A runtime with two events, on two exchanges: each message reaches the
// handler of the event its exchange and routing key are bound to (a pattern
// included), a retried one too,
// though it comes back from its retry queue (inline) or the table (buffered)
// under the queue's name; the buffered mode keeps one key's order across the
// two events; a message no binding key matches is given up as an invalid
// event, naming its key.
func TestEachEventReachesItsOwnHandler(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := withBufferedTables(t, newEnvWith(t, func(tp *rabbit.Topology) {
			tp.MoreBindings = []rabbit.Binding{{Exchange: "refunds", Key: "order.cancelled.#"}}
		}))
		var decodes atomic.Int64
		var mu sync.Mutex
		failed := map[string]bool{}
		record := func(kind string, key string, n int, msg Message) (Writes, error) {
			mu.Lock()
			first := !failed[msg.ID]
			failed[msg.ID] = true
			mu.Unlock()
			if first && n%3 == 1 {
				return nil, errTransient // once: retried, and routed again
			}
			return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
				return OutcomeProcessed, tx.Exec(`INSERT INTO ordered (key, n, message_id) VALUES (?, ?, ?)`,
					key, n, kind+"/"+msg.ID+"/"+msg.RoutingKey).Error
			}, nil
		}
		placedHandler := Typed[decodedEvent](typedFunc[decodedEvent](func(ctx context.Context, msg Message, ev decodedEvent) (Writes, error) {
			return record("placed", ev.Key, ev.N, msg)
		}))
		cancelledHandler := Typed[cancelledEvent](typedFunc[cancelledEvent](func(ctx context.Context, msg Message, ev cancelledEvent) (Writes, error) {
			return record("cancelled", ev.Key, ev.N, msg)
		}))
		dec, h, err := Routed([]Route{
			{Exchange: e.topo.Exchange, Key: e.topo.RoutingKey, Decoder: countingEvents(&decodes), Handler: placedHandler},
			{Exchange: "refunds", Key: "order.cancelled.#", Decoder: cancelledEvents(), Handler: cancelledHandler},
		})
		if err != nil {
			t.Fatal(err)
		}
		// Each key: placed 0, cancelled 1, placed 2, cancelled 3, …
		keys := []string{"a", "b"}
		const perKey = 6
		want := map[string]string{}
		for n := range perKey {
			for _, k := range keys {
				id := fmt.Sprintf("%s-%d", k, n)
				body, _ := json.Marshal(decodedEvent{ID: id, Key: k, N: n})
				ex, rk, kind := e.topo.Exchange, e.topo.RoutingKey, "placed"
				if n%2 == 1 {
					ex, rk, kind = "refunds", "order.cancelled.eu", "cancelled"
				}
				e.publishTo(ex, rk, id, string(body))
				want[id] = kind + "/" + id + "/" + rk
			}
		}
		// Straight to the queue: its origin is unknown, and it is the first
		// event's, as it was before the service consumed more.
		e.publishTo("", e.topo.Queue, "c-0", `{"id": "c-0", "key": "c", "n": 0}`)
		want["c-0"] = "placed/c-0/" + e.topo.Queue
		if m.buffered() {
			want["c-0"] = "placed/c-0/" // its origin unknown, not stored
		}
		// Through an exchange bound to the further event's (an
		// exchange-to-exchange binding): its key alone routes it.
		ch := e.channel()
		if err := ch.ExchangeDeclare("all", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.ExchangeBind("refunds", "#", "all", false, nil); err != nil {
			t.Fatal(err)
		}
		e.publishTo("all", "order.cancelled.us", "c-1", `{"id": "c-1", "key": "c", "n": 1}`)
		want["c-1"] = "cancelled/c-1/order.cancelled.us"
		// A binding no event has (left by a release that removed its event).
		if err := ch.QueueBind(e.topo.Queue, "order.refunded", e.topo.Exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		e.publishTo(e.topo.Exchange, "order.refunded", "unbound", `{"key": "d", "n": 0}`)
		rt := e.start(h, func(c *Config) {
			m.config(e.db, e.dbURL, func(b *BufferedConfig) { b.OrderingKey = nil })(c)
			c.Decoder, c.KeyFromBody = dec, nil
		})
		got := m.givenUp(e, 1)
		if len(got) != 1 || got[0].id != "unbound" || got[0].reason != wire.ReasonInvalidEvent ||
			!strings.Contains(got[0].err, `routing key "order.refunded"`) {
			t.Errorf("given up on %+v, want the unbound message alone, %s, naming its routing key", got, wire.ReasonInvalidEvent)
		}
		e.waitApplied(t, len(want))
		var rows []struct {
			Key       string
			N         int
			MessageID string
		}
		if err := e.db.Raw(`SELECT key, n, message_id FROM ordered ORDER BY id`).Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			id := fmt.Sprintf("%s-%d", r.Key, r.N)
			if r.MessageID != want[id] {
				t.Errorf("event %s applied as %q, want %q (handler/id/routing key)", id, r.MessageID, want[id])
			}
			delete(want, id)
		}
		if len(want) != 0 {
			t.Errorf("not applied: %v", want)
		}
		if m.orderPerKey {
			e.assertInOrder(keys, perKey)
			if got := e.appliedOf("c"); fmt.Sprint(got) != "[0 1]" {
				t.Errorf("key c applied %v, want [0 1]", got)
			}
		}
		rt.shutdown(t)
	})
}

// typedFunc adapts a function to HandlerOf.
type typedFunc[E any] func(ctx context.Context, msg Message, ev E) (Writes, error)

func (f typedFunc[E]) Handle(ctx context.Context, msg Message, ev E) (Writes, error) {
	return f(ctx, msg, ev)
}

// publishTo sends a persistent JSON message to exchange with key, with a confirm.
func (e *env) publishTo(exchange, key, id, body string) {
	e.t.Helper()
	ch := e.channel()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	p := amqp.Publishing{MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)}
	if err := rabbit.PublishConfirmed(context.Background(), ch, exchange, key, p); err != nil {
		e.t.Fatal(err)
	}
}
