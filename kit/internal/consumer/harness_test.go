package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// env is one test's broker vhost and database, shared by the runtimes it starts.
type env struct {
	t     testing.TB
	url   string
	vhost string
	db    *gorm.DB
	dbURL string
	topo  rabbit.Topology
	conn  *amqp.Connection
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, nil)
}

// newEnvWith is newEnv with the topology changed by tune before it is declared.
func newEnvWith(t testing.TB, tune func(*rabbit.Topology)) *env {
	t.Helper()
	url := testenv.VHost(t)
	return newEnvOn(t, url, url[strings.LastIndex(url, "/")+1:], tune)
}

// newEnvOn is newEnvWith on the broker at url (a cluster's nodes, say) in
// vhost, which the caller created.
func newEnvOn(t testing.TB, url, vhost string, tune func(*rabbit.Topology)) *env {
	t.Helper()
	e := &env{t: t, url: url, vhost: vhost}
	e.db, e.dbURL = testenv.MigratedDB(t, migrations.Inbox)
	if err := e.db.Exec(`CREATE TABLE effects (message_id text NOT NULL, body text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	e.topo = rabbit.Topology{
		Exchange: "orders", RoutingKey: "order.placed", Queue: "work", DeadLetterExchange: "dlx",
		DeadLetterQueue: "work.dlq", DeliveryLimit: 20,
		RetryDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond},
	}
	if tune != nil {
		tune(&e.topo)
	}
	conn, err := rabbit.Dial(e.url, 10*time.Second, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn = conn
	ch := e.channel()
	if err := e.topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) channel() *amqp.Channel {
	if e.conn.IsClosed() { // a fault test closed every connection of the vhost, or killed its node
		conn, err := rabbit.Dial(e.url, 10*time.Second, "test")
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { conn.Close() })
		e.conn = conn
	}
	ch, err := e.conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ch.Close() })
	return ch
}

// runtime is a started Runtime and the means to stop it.
type runtime struct {
	*Runtime
	metrics *Metrics
	logs    *testenv.Buffer
	stop    context.CancelFunc
	done    chan error
}

func (e *env) start(h Handler, tune func(*Config)) *runtime {
	e.t.Helper()
	return e.startWith(h, e.url, e.db, tune)
}

// startWith starts a runtime that reaches the broker at amqpURL and keeps its
// inbox in db (either may go through a fault-injecting proxy).
func (e *env) startWith(h Handler, amqpURL string, db *gorm.DB, tune func(*Config)) *runtime {
	e.t.Helper()
	cfg := Config{
		Name: "test", AMQPURL: amqpURL, Heartbeat: 2 * time.Second, Topology: e.topo,
		Prefetch: 8, Workers: 4, MaxAttempts: 3, ShutdownTimeout: 5 * time.Second,
		ReconnectMaxWait: time.Second,
		KeyFromBody: func(b []byte) string {
			if len(b) > 3 && string(b[:3]) == "id:" {
				return string(b[3:])
			}
			return ""
		},
		DatabaseCheck: func(ctx context.Context) error { return database.Ping(ctx, db) },
	}
	cfg.GroupCommitMax, cfg.GroupCommitWait = testenv.GroupCommit()
	if tune != nil {
		tune(&cfg)
	}
	m := NewMetrics(prometheus.NewRegistry())
	log, logs := testenv.CaptureLogger(e.t)
	rt, err := New(cfg, inbox.New(db, cfg.Name), h, 5*time.Second, m, log)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runtime{Runtime: rt, metrics: m, logs: logs, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- rt.Run(ctx) }()
	e.t.Cleanup(func() { r.shutdown(e.t) })
	testenv.Eventually(e.t, 30*time.Second, "runtime ready", func() (bool, error) { return rt.Ready() == nil, nil })
	return r
}

func (r *runtime) shutdown(t testing.TB) {
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run returned %v after shutdown", err)
		}
		r.done <- nil // let a second call pass
	case <-time.After(30 * time.Second):
		t.Error("runtime did not stop within 30s")
	}
}

func (r *runtime) count(outcome Outcome) int {
	return int(testutil.ToFloat64(r.metrics.messages.WithLabelValues(r.cfg.Name, string(outcome))))
}

// publish sends a persistent JSON message with a confirm.
func (e *env) publish(id string, body string, mutate ...func(*amqp.Publishing)) {
	e.t.Helper()
	ch := e.channel()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	p := amqp.Publishing{MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body), Timestamp: time.Now()}
	for _, m := range mutate {
		m(&p)
	}
	if err := rabbit.PublishConfirmed(context.Background(), ch, e.topo.Exchange, e.topo.RoutingKey, p); err != nil {
		e.t.Fatal(err)
	}
}

// effects counts the handler's committed writes for a message id.
func (e *env) effects(id string) int {
	e.t.Helper()
	var n int64
	if err := e.db.Table("effects").Where("message_id = ?", id).Count(&n).Error; err != nil {
		e.t.Fatal(err)
	}
	return int(n)
}

// deadLetters takes exactly n messages from the dead-letter queue, waiting for them.
func (e *env) deadLetters(n int) []amqp.Delivery {
	e.t.Helper()
	var ch *amqp.Channel
	var got []amqp.Delivery
	testenv.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d dead letters", n), func() (bool, error) {
		if ch == nil || ch.IsClosed() {
			// A fresh channel after an error: the broker closes a channel
			// on a channel-level error, and e.channel dials again if the
			// connection is gone. One channel for every poll failed a
			// fresh-clone run: every poll for 30 s answered "channel/
			// connection is not open" while the dead letter was there.
			ch = e.channel()
		}
		d, ok, err := ch.Get(e.topo.DeadLetterQueue, true)
		if err != nil {
			ch = nil
			return false, err
		}
		if ok {
			got = append(got, d)
		}
		return len(got) >= n, nil
	})
	if _, ok, _ := ch.Get(e.topo.DeadLetterQueue, true); ok {
		e.t.Fatalf("more than %d dead letters", n)
	}
	return got
}

// queueDepth is the number of ready messages in a queue.
func (e *env) queueDepth(name string) int {
	ch := e.channel()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages
}

// recordHandler writes one effect per message; fail decides per message
// whether (and how) to fail before the write.
func recordHandler(fail func(msg Message) error) Handler {
	return HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		if fail != nil {
			if err := fail(msg); err != nil {
				return nil, err
			}
		}
		return recordWrites(msg), nil
	})
}

// recordWrites inserts the message's effect row.
func recordWrites(msg Message) Writes {
	return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
		if err := tx.Exec(`INSERT INTO effects (message_id, body) VALUES (?, ?)`, msg.ID, string(msg.Body)).Error; err != nil {
			return "", err
		}
		return OutcomeProcessed, nil
	}
}

var errTransient = errors.New("gateway answered 503")

// publishMany publishes n messages with ids prefix-0 … prefix-(n-1), waiting
// for all confirms at the end.
func (e *env) publishMany(n int, prefix string) {
	e.t.Helper()
	ch := e.channel()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	ctx := context.Background()
	confirms := make([]*amqp.DeferredConfirmation, 0, n)
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, e.topo.Exchange, e.topo.RoutingKey, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("%s-%d", prefix, i), ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf(`{"n":%d}`, i)),
		})
		if err != nil {
			e.t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if !dc.Wait() {
			e.t.Fatal("publish not confirmed")
		}
	}
}

// applied returns how many effects were committed and for how many distinct ids.
func (e *env) applied() (total, distinct int) {
	e.t.Helper()
	row := e.db.Raw(`SELECT count(*), count(DISTINCT message_id) FROM effects`).Row()
	if err := row.Scan(&total, &distinct); err != nil {
		e.t.Fatal(err)
	}
	return total, distinct
}

// brokerStatsInterval is RabbitMQ's collect_statistics_interval (its
// default, 5 s) and a second: how long a queue's counts in list_queues may
// lag.
const brokerStatsInterval = 6 * time.Second

// assertAllAppliedOnce waits until n distinct messages are applied, for as
// long as their count keeps rising (failing when it stood still for stall),
// then until the work queue holds nothing, ready or delivered and unacked,
// and checks that none was applied twice, none was dead-lettered and the
// inbox matches.
func (e *env) assertAllAppliedOnce(n int, stall time.Duration) {
	e.t.Helper()
	testenv.Reaches(e.t, stall, fmt.Sprintf("%d messages applied", n), n, func() (int, error) {
		_, distinct := e.applied()
		return distinct, nil
	})
	// A redelivery still queued, or delivered and not yet settled, would
	// apply a message twice after the count. Ready messages are read live
	// (a passive declare); unacked ones only from list_queues, whose counts
	// of a quorum queue lag by up to the broker's statistics interval: the
	// queue must read empty for longer than that.
	var emptySince time.Time
	testenv.Eventually(e.t, stall, "the work queue empty, nothing unacked", func() (bool, error) {
		_, unacked := e.brokerHolds()
		if e.queueDepth(e.topo.Queue) != 0 || unacked != 0 {
			emptySince = time.Time{}
			return false, nil
		}
		if emptySince.IsZero() {
			emptySince = time.Now()
		}
		if time.Since(emptySince) > brokerStatsInterval {
			return true, nil
		}
		time.Sleep(500 * time.Millisecond) // the pace: the counts change once an interval
		return false, nil
	})
	if total, _ := e.applied(); total != n {
		e.t.Errorf("%d effects for %d messages: some applied twice", total, n)
	}
	var inboxRows int64
	e.db.Table("inbox").Count(&inboxRows)
	if int(inboxRows) != n {
		e.t.Errorf("%d inbox rows for %d applied messages", inboxRows, n)
	}
	if d := e.queueDepth(e.topo.DeadLetterQueue); d != 0 {
		e.t.Errorf("%d messages dead-lettered", d)
	}
}

func counterValue(c interface{ Write(*dto.Metric) error }) int {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return int(m.GetCounter().GetValue())
}
