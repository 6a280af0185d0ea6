package producer

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit/kittest"
)

const (
	testExchange = "orders"
	testKey      = "order.placed"
)

func TestRunPublishesTheLoad(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	bindQueue(t, url)
	cfg := testConfig(url, Load{RunID: "run1", Count: 60, Seed: 7, DuplicateRate: 0.3, RepublishRate: 0.2, Poison: 22})

	sum := mustRun(t, cfg)
	got := consumeAll(t, url)

	if sum.Orders != 60 || sum.PoisonTotal != 22 || sum.Duplicates == 0 || sum.Republishes == 0 {
		t.Errorf("summary %+v: want 60 orders, 22 poison and some duplicates and republishes", sum)
	}
	if want := sum.Orders + sum.Duplicates + sum.Republishes + sum.PoisonTotal; sum.Published != want || len(got) != want {
		t.Fatalf("published %d, consumed %d, want %d", sum.Published, len(got), want)
	}
	c := classify(t, got, cfg.Load)
	if len(c.orders) != 60 {
		t.Errorf("%d distinct order ids, want 60", len(c.orders))
	}
	if n := c.countRepeated(); n != sum.Duplicates {
		t.Errorf("%d message ids delivered twice, want %d duplicates", n, sum.Duplicates)
	}
	if n := c.countRepublished(t); n != sum.Republishes {
		t.Errorf("%d orders under two event ids, want %d republishes", n, sum.Republishes)
	}
	for _, k := range PoisonKinds() {
		if c.poison[k] != 2 || sum.Poison[string(k)] != 2 {
			t.Errorf("poison %s: consumed %d, summary %d, want 2", k, c.poison[k], sum.Poison[string(k)])
		}
	}
}

func TestRunWithoutMessageID(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	bindQueue(t, url)
	cfg := testConfig(url, Load{RunID: "noid", Count: 30, Seed: 3, DuplicateRate: 0.5, NoMessageID: true})

	sum := mustRun(t, cfg)
	c := classify(t, consumeAll(t, url), cfg.Load)
	if len(c.orders) != 30 || c.countRepeated() != sum.Duplicates || sum.Duplicates == 0 {
		t.Errorf("%d orders, %d repeated event ids; summary %+v", len(c.orders), c.countRepeated(), sum)
	}
}

func TestRunRespectsTheRate(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	bindQueue(t, url)
	cfg := testConfig(url, Load{RunID: "slow", Count: 20, Seed: 1})
	cfg.Rate = 100

	start := time.Now()
	mustRun(t, cfg)
	// 20 messages at 100/s are 19 intervals of 10ms.
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("20 messages at 100/s took %s", d)
	}
}

func TestRunFailsWhenNothingIsBound(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	cfg := testConfig(url, Load{RunID: "lost", Count: 50, Seed: 1})

	sum, err := Run(testContext(t), cfg, testLogger(t))
	if !errors.Is(err, ErrReturned) {
		t.Fatalf("Run() = %v, want ErrReturned", err)
	}
	if want := "no queue bound to exchange orders with key order.placed: start payment-service first"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if sum.OK || sum.Returned == 0 || sum.Error != err.Error() {
		t.Errorf("summary %+v does not report the returned messages", sum)
	}
}

// TestRunSurvivesConnectionLoss cuts the connection twice mid-stream, with the
// broker unreachable for a while after the first cut: every order must still
// arrive, and the messages left unconfirmed are published again.
func TestRunSurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	bindQueue(t, url)
	proxy := newProxy(t, "127.0.0.1:5672")
	cfg := testConfig(proxy.url(t, url), Load{RunID: "cut", Count: 4000, Seed: 9, DuplicateRate: 0.1, Poison: 11})
	proxy.cutAfter(300_000, 300*time.Millisecond) // bytes from the client, then refuse connections for a while
	proxy.cutAfter(800_000, 0)

	sum := mustRun(t, cfg)
	got := consumeAll(t, url)

	if sum.Reconnects != 2 || sum.RepublishedAfterReconnect == 0 {
		t.Errorf("summary %+v: want 2 reconnects and some messages published again", sum)
	}
	if len(got) < sum.Published || len(got) > sum.Published+sum.RepublishedAfterReconnect {
		t.Errorf("consumed %d messages, want %d to %d", len(got), sum.Published, sum.Published+sum.RepublishedAfterReconnect)
	}
	c := classify(t, got, cfg.Load)
	if len(c.orders) != 4000 {
		t.Errorf("%d distinct orders arrived, want 4000", len(c.orders))
	}
	for _, k := range PoisonKinds() {
		if c.poison[k] == 0 {
			t.Errorf("poison %s lost", k)
		}
	}
}

// On a cluster (AMQP_URL lists every node), the reconnect after a lost
// connection dials the next node first, not the one that dropped it: a node
// that died without a word would cost a dial timeout at every reconnect.
// Two proxies to one broker stand for two nodes; the first drops the
// connection mid-stream and then refuses for a minute.
func TestRunReconnectsToTheNextNode(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	bindQueue(t, url)
	one, two := newProxy(t, "127.0.0.1:5672"), newProxy(t, "127.0.0.1:5672")
	one.cutAfter(200_000, time.Minute)
	cfg := testConfig(one.url(t, url)+","+two.url(t, url), Load{RunID: "nodes", Count: 2000, Seed: 4})

	sum := mustRun(t, cfg)
	got := consumeAll(t, url)

	if sum.Reconnects != 1 {
		t.Errorf("summary %+v: want 1 reconnect", sum)
	}
	if n := one.dialled(); n != 1 {
		t.Errorf("node 1 was dialled %d times, want once: the reconnect went back to the node that had dropped the connection", n)
	}
	if n := two.dialled(); n != 1 {
		t.Errorf("node 2 was dialled %d times, want once (the reconnect)", n)
	}
	if c := classify(t, got, cfg.Load); len(c.orders) != 2000 {
		t.Errorf("%d distinct orders arrived, want 2000", len(c.orders))
	}
}

func TestRunRejectsAnInvalidLoad(t *testing.T) {
	t.Parallel()
	_, err := Run(testContext(t), testConfig("amqp://guest:guest@127.0.0.1:5672/", Load{RunID: "r", DuplicateRate: 2}), testLogger(t))
	if err == nil || !strings.Contains(err.Error(), "duplicate rate") {
		t.Errorf("Run() = %v, want an error about the duplicate rate", err)
	}
}

func testConfig(url string, load Load) Config {
	return Config{
		Broker: Broker{URL: url, Exchange: testExchange, RoutingKey: testKey, Heartbeat: 2 * time.Second, Name: "producer test"},
		Load:   load,
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func mustRun(t *testing.T, cfg Config) Summary {
	t.Helper()
	sum, err := Run(testContext(t), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("Run() = %v; summary %+v", err, sum)
	}
	if !sum.OK || sum.Confirmed != sum.Published || sum.Returned != 0 || sum.Nacked != 0 {
		t.Fatalf("summary %+v: want every message confirmed", sum)
	}
	return sum
}

// bindQueue declares the exchange and a queue bound to it, as the payment
// service would.
func bindQueue(t *testing.T, url string) {
	t.Helper()
	kittest.WithChannel(t, url, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(testExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("payments", true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind("payments", testKey, testExchange, false, nil)
	})
}

// consumeAll takes every message from the bound queue. Confirmed messages are
// already enqueued, so an empty queue means all have been read.
func consumeAll(t *testing.T, url string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	kittest.WithChannel(t, url, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get("payments", true)
			if err != nil || !ok {
				return err
			}
			out = append(out, d)
		}
	})
	return out
}

// consumed sorts what a consumer received.
type consumed struct {
	orders map[string][]orders.OrderPlaced // by order id, valid messages in arrival order
	byID   map[string]int                  // deliveries per dedupe key of valid messages
	poison map[PoisonKind]int
}

// classify checks every delivery: poison has the shape of its kind, everything
// else is a valid order with the right properties.
func classify(t *testing.T, ds []amqp.Delivery, load Load) consumed {
	t.Helper()
	c := consumed{orders: map[string][]orders.OrderPlaced{}, byID: map[string]int{}, poison: map[PoisonKind]int{}}
	for _, d := range ds {
		if kind, ok := poisonKind(d); ok {
			if err := checkPoison(kind, d.ContentType, d.MessageId, d.Body); err != nil {
				t.Error(err)
			}
			c.poison[kind]++
			continue
		}
		o, err := orders.Decode(d.Body)
		if err != nil {
			t.Fatalf("message %q (%s): %v", d.MessageId, d.Body, err)
		}
		p := amqp.Publishing{ContentType: d.ContentType, DeliveryMode: d.DeliveryMode, MessageId: d.MessageId, Timestamp: d.Timestamp}
		if err := checkValidProperties(p, o, load.NoMessageID); err != nil {
			t.Error(err)
		}
		c.orders[o.OrderID] = append(c.orders[o.OrderID], o)
		c.byID[o.EventID]++
	}
	return c
}

// poisonKind recognises a poison message by its message id, or, for the one
// without any id, by its missing event_id.
func poisonKind(d amqp.Delivery) (PoisonKind, bool) {
	if strings.HasPrefix(d.MessageId, "poison-") {
		for _, k := range PoisonKinds() {
			if strings.HasSuffix(d.MessageId, "-"+string(k)) {
				return k, true
			}
		}
	}
	var fields map[string]any
	if d.MessageId == "" && json.Unmarshal(d.Body, &fields) == nil && fields["event_id"] == nil {
		return PoisonNoID, true
	}
	return "", false
}

// countRepeated counts dedupe keys delivered more than once.
func (c consumed) countRepeated() int {
	n := 0
	for _, k := range c.byID {
		if k > 1 {
			n++
		}
	}
	return n
}

// countRepublished counts orders that arrived under more than one event id,
// checking that every copy carries the same order.
func (c consumed) countRepublished(t *testing.T) int {
	t.Helper()
	n := 0
	for id, copies := range c.orders {
		events := map[string]bool{}
		for _, o := range copies {
			events[o.EventID] = true
			if !sameOrder(o, copies[0]) {
				t.Errorf("order %s arrived as %+v and as %+v", id, copies[0], o)
			}
		}
		if len(events) > 1 {
			n++
		}
	}
	return n
}

// A broker that refuses messages for a while (basic.nack: a quorum queue
// without a leader during an election; here a full queue that rejects
// publishes) delays them, never drops them: each is sent again after a
// pause until it is confirmed.
func TestRunSendsARefusedMessageAgain(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	kittest.WithChannel(t, url, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(testExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		args := amqp.Table{"x-max-length": int64(10), "x-overflow": "reject-publish"}
		if _, err := ch.QueueDeclare("payments", true, false, false, false, args); err != nil {
			return err
		}
		return ch.QueueBind("payments", testKey, testExchange, false, nil)
	})
	// Room for ten at a time: a reader takes what is there every 300 ms.
	var got []amqp.Delivery
	done := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			select {
			case <-done:
				return
			case <-time.After(300 * time.Millisecond):
			}
			got = append(got, consumeAll(t, url)...)
		}
	}()
	sum := mustRun(t, testConfig(url, Load{RunID: "nacked", Count: 40, Seed: 5}))
	close(done)
	<-read
	got = append(got, consumeAll(t, url)...)
	// Each order reaches the queue at least once. A message the queue took
	// but whose confirm had not come when the nack's reconnect closed the
	// channel is sent again with the same id (the consumer's inbox drops
	// the copy): a run once delivered 41 copies of 40 orders.
	ids := map[string]int{}
	for _, d := range got {
		ids[d.MessageId]++
	}
	if len(ids) != 40 || sum.Confirmed != 40 {
		t.Errorf("%d of 40 orders reached the queue (%d copies), %d confirmed; summary %+v", len(ids), len(got), sum.Confirmed, sum)
	}
	if sum.RepublishedAfterReconnect == 0 {
		t.Errorf("nothing was sent again: the queue never refused a message (summary %+v)", sum)
	}
}

// A setup step that fails because the connection went away is an outage
// (the publisher reconnects); one the broker refuses on a live connection
// is a mistake (it fails at once). A fault that closed every connection of
// the vhost between the dial and the channel's open once ended a
// publisher with nothing published.
func TestSetupTellsALostConnectionFromARefusal(t *testing.T) {
	t.Parallel()
	url := kittest.VHost(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("x", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// The same exchange with another type: 406 on the channel, the
	// connection lives on.
	refused := ch.ExchangeDeclare("x", amqp.ExchangeDirect, true, false, false, false, nil)
	if refused == nil {
		t.Fatal("the broker took an exchange of another type")
	}
	if err := setupFailed(conn, refused); errors.Is(err, errConnectionLost) {
		t.Errorf("a refused declaration was taken for a lost connection: %v", err)
	}

	// The broker closes the connection (320) while a call waits.
	conn, err = amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	kittest.Eventually(t, 30*time.Second, "the broker closed the connection", func() (bool, error) {
		kittest.CloseConnections(t, url[strings.LastIndex(url, "/")+1:], "test")
		select {
		case <-closed:
			return true, nil
		default:
			return false, nil
		}
	})
	_, lost := conn.Channel()
	if err := setupFailed(conn, lost); !errors.Is(err, errConnectionLost) {
		t.Errorf("a setup on a connection the broker closed: %v, want errConnectionLost", err)
	}
}
