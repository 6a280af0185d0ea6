package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// env is one test's vhost, with an exchange and a queue bound to it, and a
// database with the outbox schema.
type env struct {
	t      testing.TB
	amqp   string
	db     *gorm.DB
	dbURL  string
	outbox *Outbox
	store  *Store
}

const (
	exchange = "events"
	key      = "thing.happened"
	queue    = "downstream"
)

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{t: t, amqp: testenv.VHost(t)}
	e.db, e.dbURL = testenv.MigratedDB(t, migrations.Outbox)
	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	e.outbox, e.store = New("producer"), NewStore(sqlDB, "producer")
	testenv.WithChannel(t, e.amqp, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return err
		}
		return ch.QueueBind(queue, key, exchange, false, nil)
	})
	return e
}

// relay starts a relay on amqpURL (the vhost, or a proxy in front of it)
// sharing e's outbox; tune adjusts it. The returned function stops it.
func (e *env) relay(amqpURL string, tune func(*RelayConfig)) (*Relay, *Metrics, func()) {
	e.t.Helper()
	cfg := RelayConfig{AMQPURL: amqpURL, Name: "test", Exchanges: []string{exchange}, PollInterval: 200 * time.Millisecond,
		RetryDelays: []time.Duration{50 * time.Millisecond}, MaxAttempts: 3, ListenURL: e.dbURL, ReconnectMaxWait: time.Second}
	if tune != nil {
		tune(&cfg)
	}
	m := NewMetrics(prometheus.NewRegistry())
	r, err := NewRelay(cfg, e.store, e.outbox, m, testenv.Logger(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				e.t.Error("relay did not stop within 30s")
			}
		})
	}
	e.t.Cleanup(stop)
	return r, m, stop
}

// depth is how many messages wait ready in the downstream queue.
func (e *env) depth() int {
	e.t.Helper()
	var n int
	testenv.WithChannel(e.t, e.amqp, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// emit commits msgs in one transaction (or rolls it back with fail) and
// wakes the relay as a caller outside the consumer runtime must.
func (e *env) emit(fail error, msgs ...Message) ([]string, error) {
	var ids []string
	err := e.db.Transaction(func(tx *gorm.DB) error {
		var err error
		if ids, err = e.outbox.Enqueue(context.Background(), tx, msgs...); err != nil {
			return err
		}
		return fail
	})
	if err == nil {
		e.outbox.Wake()
	}
	return ids, err
}

func event(n int, orderingKey string) Message {
	return Message{Exchange: exchange, RoutingKey: key, Body: fmt.Appendf(nil, `{"n":%d,"key":%q}`, n, orderingKey), OrderingKey: orderingKey}
}

// received takes every message from the downstream queue until want
// distinct messages (by message id) have arrived, then waits a little for
// any more: duplicates are counted once, or a run with relays that died
// before their mark would stop before the last messages came.
func (e *env) received(want int) []amqp.Delivery {
	e.t.Helper()
	conn, err := amqp.Dial(e.amqp)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := ch.Qos(500, 0, false); err != nil {
		e.t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	var got []amqp.Delivery
	ids := map[string]bool{} // a relay that died before its mark publishes its rows again: count each message once
	deadline := time.After(2 * time.Minute)
	for len(ids) < want {
		select {
		case d := <-deliveries:
			got = append(got, d)
			id := d.MessageId
			if id == "" {
				id = fmt.Sprint("delivery ", len(got))
			}
			ids[id] = true
		case <-deadline:
			e.t.Fatalf("received %d of %d messages (%d deliveries)", len(ids), want, len(got))
		}
	}
	for {
		select {
		case d := <-deliveries:
			got = append(got, d)
		case <-time.After(500 * time.Millisecond):
			return got
		}
	}
}

func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int64
	if err := e.db.Table("outbox").Where(where, args...).Count(&n).Error; err != nil {
		e.t.Fatal(err)
	}
	return int(n)
}

// A rolled-back transaction's messages are never published; a committed
// one's are, each with its outbox id as the AMQP message_id, and marked sent.
func TestCommittedMessagesArePublishedRolledBackNever(t *testing.T) {
	e := newEnv(t)
	e.relay(e.amqp, nil)
	if _, err := e.emit(errors.New("the business write failed"), event(1, ""), event(2, "k")); err == nil {
		t.Fatal("the rolled-back transaction reported success")
	}
	ids, err := e.emit(nil, event(3, ""), event(4, "k"))
	if err != nil {
		t.Fatal(err)
	}
	got := e.received(2)
	if len(got) != 2 {
		t.Fatalf("received %d messages, want the committed 2", len(got))
	}
	for i, d := range got {
		if d.MessageId != ids[i] || d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" {
			t.Errorf("message %d: id %q persistent %v type %q, want id %q, persistent JSON", i, d.MessageId, d.DeliveryMode == amqp.Persistent, d.ContentType, ids[i])
		}
		if !strings.Contains(string(d.Body), fmt.Sprintf(`"n":%d`, i+3)) {
			t.Errorf("message %d body %s", i, d.Body)
		}
	}
	testenv.Eventually(t, 10*time.Second, "both marked sent", func() (bool, error) { return e.count("status = 'sent'") == 2, nil })
	if n := e.count("1=1"); n != 2 {
		t.Errorf("%d outbox rows, want the committed 2", n)
	}
}

// Two relays over one table and 5,000 messages: every message is published,
// none by both relays (no crash: each exactly once).
func TestTwoRelaysPublishEachMessageOnce(t *testing.T) {
	e := newEnv(t)
	const n = 5000
	for i := 0; i < n; i += 100 {
		msgs := make([]Message, 0, 100)
		for j := i; j < i+100; j++ {
			k := ""
			if j%3 == 0 {
				k = fmt.Sprintf("key-%d", j%17)
			}
			msgs = append(msgs, event(j, k))
		}
		if _, err := e.emit(nil, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	_, m1, _ := e.relay(e.amqp, nil)
	_, m2, _ := e.relay(e.amqp, nil)
	got := e.received(n)
	perID := map[string]int{}
	for _, d := range got {
		perID[d.MessageId]++
	}
	for id, c := range perID {
		if c != 1 {
			t.Errorf("message %s published %d times", id, c)
		}
	}
	if len(perID) != n || len(got) != n {
		t.Errorf("received %d messages, %d distinct, want %d", len(got), len(perID), n)
	}
	testenv.Eventually(t, 30*time.Second, "all marked sent", func() (bool, error) { return e.count("status = 'sent'") == n, nil })
	t.Logf("relay 1 published %d, relay 2 %d", m1.Published("producer"), m2.Published("producer"))
	if m1.Published("producer")+m2.Published("producer") != n {
		t.Errorf("the relays marked %d + %d, want %d", m1.Published("producer"), m2.Published("producer"), n)
	}
}

// The messages of one ordering key, committed by two writers interleaved
// with other keys' and unordered ones, arrive in their commit order, also
// when relays die between the broker's confirm and the mark (the head is
// published again, with its id, and the key goes on after it).
func TestOrderingKeyArrivesInCommitOrderAcrossRelayCrashes(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var committed []string // the key's ids in commit order
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range 25 {
				var ids []string
				err := e.db.Transaction(func(tx *gorm.DB) error {
					var err error
					ids, err = e.outbox.Enqueue(context.Background(), tx, event(i, fmt.Sprintf("other-%d", w)), event(100*w+i, "hot"), event(i, ""))
					if err != nil {
						return err
					}
					// Record the commit order while the key's row lock is held:
					// the next writer of the key cannot commit before this one.
					mu.Lock()
					committed = append(committed, ids[1])
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// Relays that die after their first confirmed batch, before its mark,
	// until the writers are done; then one that lives.
	var crashes int
	buried := make(chan struct{}) // the dead relays end with the test
	for range 3 {
		died := make(chan struct{})
		var once sync.Once
		e.relay(e.amqp, func(c *RelayConfig) {
			c.Batch, c.Lease = 4, 16*time.Second
			c.OnPublished = func() { // hangs like a dead process: its batch stays leased, confirmed and unmarked
				once.Do(func() { close(died) })
				<-buried
			}
		})
		select {
		case <-died:
			crashes++
		case <-time.After(10 * time.Second):
		}
	}
	t.Cleanup(func() { close(buried) })
	wg.Wait()
	e.relay(e.amqp, func(c *RelayConfig) { c.Lease = 16 * time.Second })
	got := e.received(150)
	var order []string
	seen := map[string]bool{}
	for _, d := range got {
		if strings.Contains(string(d.Body), `"key":"hot"`) && !seen[d.MessageId] {
			seen[d.MessageId] = true
			order = append(order, d.MessageId)
		}
	}
	if crashes == 0 {
		t.Error("no relay died between confirm and mark: the test proved nothing about crashes")
	}
	if fmt.Sprint(order) != fmt.Sprint(committed) {
		t.Errorf("the key's 50 messages arrived out of commit order:\n got %v\nwant %v", order, committed)
	}
	t.Logf("%d relays died between confirm and mark; %d deliveries for 150 messages", crashes, len(got))
}

// A message no queue is bound for is returned by the broker: retried, then
// parked with its reason, and the others flow meanwhile; outbox retry makes
// it pending again.
func TestUnroutableIsParkedOthersFlow(t *testing.T) {
	e := newEnv(t)
	_, m, _ := e.relay(e.amqp, nil)
	lost := Message{Exchange: exchange, RoutingKey: "nobody.listens", Body: []byte(`{}`)}
	announced := Message{Exchange: exchange, RoutingKey: "nobody.listens", Body: []byte(`{}`), Optional: true}
	ids, err := e.emit(nil, lost, announced, event(1, ""), event(2, "k"))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.received(2); len(got) != 2 {
		t.Fatalf("received %d, want the two routable ones", len(got))
	}
	testenv.Eventually(t, 30*time.Second, "the unroutable one parked", func() (bool, error) {
		return e.count("status = 'parked'") == 1 && e.count("status = 'sent'") == 3, nil
	})
	parked, err := e.store.ListParked(context.Background(), 10)
	if err != nil || len(parked) != 1 || parked[0].ID != ids[0] || parked[0].Reason != ReasonUnroutable || parked[0].Attempts != 3 {
		t.Fatalf("parked %+v (%v), want %s unroutable after 3 attempts", parked, err, ids[0])
	}
	if n, err := e.store.Retry(context.Background(), ids[0]); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	if st, err := e.store.Status(context.Background()); err != nil || st.Pending+st.Parked != 1 {
		t.Errorf("status %+v, %v: the retried row pending (or parked again)", st, err)
	}
	_ = m
}

// The broker is unreachable while a backlog waits, for ten failed
// reconnections (MaxAttempts is 3): nothing is lost, nothing is parked, and
// the relay resumes by itself.
func TestBrokerAwayWithABacklogLosesNothing(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(e.amqp)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, "amqp", u.Host)
	proxied := *u
	proxied.Host = proxy.Listen
	r, m, _ := e.relay(proxied.String(), nil)
	testenv.Eventually(t, 10*time.Second, "connected", func() (bool, error) { return r.Ready() == nil, nil })
	proxy.Stop()
	const n = 500
	for i := 0; i < n; i += 50 {
		msgs := make([]Message, 50)
		for j := range msgs {
			msgs[j] = event(i+j, fmt.Sprintf("k-%d", (i+j)%5))
		}
		if _, err := e.emit(nil, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "not ready while the broker is away", func() (bool, error) { return r.Ready() != nil, nil })
	reconnects := func() float64 { return testutil.ToFloat64(m.reconnects.WithLabelValues(e.store.Producer())) }
	from := reconnects()
	testenv.Eventually(t, time.Minute, "ten failed reconnections", func() (bool, error) { return reconnects()-from >= 10, nil })
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	got := e.received(n)
	distinct := map[string]bool{}
	for _, d := range got {
		distinct[d.MessageId] = true
	}
	if len(distinct) != n {
		t.Errorf("%d distinct messages arrived, want %d", len(distinct), n)
	}
	testenv.Eventually(t, 30*time.Second, "all sent", func() (bool, error) { return e.count("status = 'sent'") == n, nil })
	if p := e.count("status = 'parked'"); p != 0 {
		t.Errorf("%d parked: the broker's absence is not the messages' fault", p)
	}
}

// The link dies while a batch waits for its confirms (the broker went silent,
// then the connection was cut): the relay gives the batch back and
// reconnects, instead of spinning on the returns channel the library closed
// with the channel.
func TestLinkCutWhileWaitingForConfirmsReconnects(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(e.amqp)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, "amqp", u.Host)
	proxied := *u
	proxied.Host = proxy.Listen
	r, _, _ := e.relay(proxied.String(), nil)
	testenv.Eventually(t, 10*time.Second, "connected", func() (bool, error) { return r.Ready() == nil, nil })
	testenv.AddToxic(t, proxy, `{"name":"silent","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
	if _, err := e.emit(nil, event(1, ""), event(2, "k")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the batch published, its confirms held back", func() (bool, error) {
		return e.depth() == 2, nil
	})
	testenv.RemoveToxic(t, proxy, "silent")
	proxy.Stop() // cut the connection that saw the silence
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	got := e.received(2)
	if len(got) < 2 {
		t.Fatalf("received %d of 2", len(got))
	}
	testenv.Eventually(t, 30*time.Second, "both marked sent", func() (bool, error) { return e.count("status = 'sent'") == 2, nil })
}

// eventually waits for cond, as testenv.Eventually does, for a bool condition.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, what, func() (bool, error) { return cond(), nil })
}

func (e *env) logger() *slog.Logger { return testenv.Logger(e.t) }
