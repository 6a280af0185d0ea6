package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// newBufferedEnv is newEnvWith plus the buffered inbox's tables and a table
// that records the order in which a handler applied events.
func newBufferedEnv(t testing.TB, tune func(*rabbit.Topology)) *env {
	t.Helper()
	return withBufferedTables(t, newEnvWith(t, tune))
}

// withBufferedTables adds the buffered inbox and the ordering tests' table
// to e's database.
func withBufferedTables(t testing.TB, e *env) *env {
	t.Helper()
	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(context.Background(), sqlDB, migrations.Buffered); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Exec(`CREATE TABLE ordered (id bigserial PRIMARY KEY, key text NOT NULL, n int NOT NULL, message_id text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	return e
}

func singleActive(t *rabbit.Topology) { t.SingleActive = true }

// event is the body of the ordering tests.
type event struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

func eventKey(body []byte) string {
	var ev event
	if json.Unmarshal(body, &ev) != nil {
		return ""
	}
	return ev.Key
}

// withBuffered switches a runtime to the buffered inbox on db, with short
// delays; more adjusts it.
func withBuffered(db *gorm.DB, dbURL string, more func(*BufferedConfig)) func(*Config) {
	return func(c *Config) {
		b := &BufferedConfig{
			Store: buffered.New(db, "test"), OrderingKey: eventKey,
			RetryDelays: []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond},
			MaxAttempts: 5, PollInterval: 250 * time.Millisecond, ListenURL: dbURL, Lease: 3 * time.Second,
		}
		if more != nil {
			more(b)
		}
		c.Buffered = b
	}
}

// orderedHandler records each event it applies in the table ordered; fail
// decides per event whether (and how) to fail first.
func orderedHandler(fail func(msg Message, ev event) error) Handler {
	return HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		var ev event
		if err := json.Unmarshal(msg.Body, &ev); err != nil {
			return nil, Permanent(NewReason("malformed_json"), err)
		}
		if fail != nil {
			if err := fail(msg, ev); err != nil {
				return nil, err
			}
		}
		return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
			return OutcomeProcessed, tx.Exec(`INSERT INTO ordered (key, n, message_id) VALUES (?, ?, ?)`, ev.Key, ev.N, msg.ID).Error
		}, nil
	})
}

// publishEvents publishes perKey events for each key, interleaved (event 0 of
// every key, then event 1, …), on one channel: the broker keeps that order.
func (e *env) publishEvents(keys []string, perKey int) {
	e.t.Helper()
	ch := e.channel()
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	var confirms []*amqp.DeferredConfirmation
	for n := range perKey {
		for _, k := range keys {
			body, _ := json.Marshal(event{Key: k, N: n})
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), e.topo.Exchange, e.topo.RoutingKey, false, false,
				amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", k, n), ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body})
			if err != nil {
				e.t.Fatal(err)
			}
			confirms = append(confirms, dc)
		}
	}
	for _, dc := range confirms {
		if !dc.Wait() {
			e.t.Fatal("publish not confirmed")
		}
	}
}

func keyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}
	return keys
}

// appliedOf lists the events of key in the order they were applied.
func (e *env) appliedOf(key string) []int {
	e.t.Helper()
	var ns []int
	if err := e.db.Raw(`SELECT n FROM ordered WHERE key = ? ORDER BY id`, key).Scan(&ns).Error; err != nil {
		e.t.Fatal(err)
	}
	return ns
}

// waitApplied waits until want events are applied, for as long as more
// keep being applied: a backlog on a loaded machine takes what it takes, a
// wedge fails after a minute with no progress.
func (e *env) waitApplied(t *testing.T, want int) {
	t.Helper()
	testenv.Reaches(t, time.Minute, "every event applied", want, func() (int, error) { return e.appliedTotal(), nil })
}

func (e *env) appliedTotal() int {
	e.t.Helper()
	var n int
	if err := e.db.Raw(`SELECT count(*) FROM ordered`).Row().Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// assertInOrder checks that each key's events 0…n-1 were applied once each,
// in order.
func (e *env) assertInOrder(keys []string, n int) {
	e.t.Helper()
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	for _, k := range keys {
		if got := e.appliedOf(k); fmt.Sprint(got) != fmt.Sprint(want) {
			e.t.Errorf("key %s applied %v, want %v", k, got, want)
		}
	}
}

func (e *env) statusCount(s buffered.Status) int {
	e.t.Helper()
	var n int
	if err := e.db.Raw(`SELECT count(*) FROM inbox_messages WHERE status = ?`, string(s)).Row().Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// The buffered mode stores and acks each delivery, then processes it from the
// table: duplicates are suppressed at ingest, every message is applied once,
// and each ends processed.
func TestBufferedStoresThenProcessesOnce(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	rt := e.start(orderedHandler(nil), withBuffered(e.db, e.dbURL, nil))
	keys := keyNames(10)
	e.publishEvents(keys, 20)
	e.publishEvents(keys[:3], 20) // the same ids again
	waitFor(t, "every delivery stored or suppressed", func() bool { return rt.count(OutcomeStored)+rt.count(OutcomeDuplicate) == 260 })
	waitFor(t, "200 events applied", func() bool { return e.appliedTotal() >= 200 })
	waitFor(t, "every stored message processed", func() bool { return e.statusCount(buffered.StatusProcessed) == 200 })
	e.assertInOrder(keys, 20)
	if got := rt.count(OutcomeStored); got != 200 {
		t.Errorf("stored %d, want 200", got)
	}
	if got := rt.count(OutcomeDuplicate); got != 60 {
		t.Errorf("duplicates %d, want 60", got)
	}
	if got := rt.count(OutcomeProcessed); got != 200 {
		t.Errorf("processed %d, want 200", got)
	}
	if d := e.queueDepth(e.topo.Queue); d != 0 {
		t.Errorf("%d messages left in the work queue", d)
	}
}

// Events of one key published in order are applied in that order, once each,
// by two replicas (single active consumer: one ingests, both process) whose
// handlers fail at random; a permanent failure parks its key's head, which
// blocks that key and no other until an operator skips it.
func TestBufferedOrderPerKeyAcrossTwoReplicas(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, singleActive)
	keys := keyNames(12)
	const perKey = 25
	poison := "key-03-7" // event 7 of key-03 fails for good
	handler := orderedHandler(func(msg Message, ev event) error {
		switch {
		case msg.ID == poison:
			return Permanent(NewReason("invalid_field"), fmt.Errorf("event %s refused", msg.ID))
		case rand.Float64() < 0.2:
			return errTransient
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		return nil
	})
	tune := withBuffered(e.db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = 50 })
	a := e.start(handler, func(c *Config) { tune(c); c.Workers = 6 })
	b := e.start(handler, func(c *Config) { tune(c); c.Workers = 6 })
	e.publishEvents(keys, perKey)
	others := keys[:3:3]
	others = append(others, keys[4:]...)
	waitFor(t, "every other key applied", func() bool { return e.appliedTotal() >= len(others)*perKey+7 })
	e.assertInOrder(others, perKey)
	if got := e.appliedOf("key-03"); fmt.Sprint(got) != "[0 1 2 3 4 5 6]" {
		t.Errorf("blocked key applied %v, want events 0-6 and nothing after its parked head", got)
	}
	if n := e.statusCount(buffered.StatusParked); n != 1 {
		t.Fatalf("%d parked, want 1", n)
	}
	skipped, err := buffered.New(e.db, "test").Skip(context.Background(), buffered.Selector{MessageID: poison})
	if err != nil || skipped != 1 {
		t.Fatalf("skip: %d %v", skipped, err)
	}
	waitFor(t, "the blocked key applied after the skip", func() bool { return len(e.appliedOf("key-03")) == perKey-1 })
	want := []int{}
	for n := range perKey {
		if n != 7 {
			want = append(want, n)
		}
	}
	if got := e.appliedOf("key-03"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("key-03 applied %v, want %v", got, want)
	}
	t.Logf("replica a processed %d, b %d; retried %d", a.count(OutcomeProcessed), b.count(OutcomeProcessed),
		a.count(OutcomeRetried)+b.count(OutcomeRetried))
	if a.count(OutcomeProcessed) == 0 || b.count(OutcomeProcessed) == 0 {
		t.Error("one replica processed nothing: the test did not prove ordering across replicas")
	}
}

// A dependency down for a long time (here a few seconds, standing for 45
// minutes): every delivery is stored and acked at once, none waits unacked on
// the broker; the processing pauses once the handler has failed
// PauseAfterFailures messages in a row, spending no attempts; and all are
// applied once when the dependency is back, none parked.
func TestBufferedDependencyOutageLeavesNothingOnTheBroker(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	var down atomic.Bool
	down.Store(true)
	handler := orderedHandler(func(Message, event) error {
		if down.Load() {
			return errTransient
		}
		return nil
	})
	rt := e.start(handler, withBuffered(e.db, e.dbURL, func(b *BufferedConfig) {
		b.RetryDelays = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond}
		b.MaxAttempts = 10_000
	}))
	keys := keyNames(30)
	e.publishEvents(keys, 10)
	waitFor(t, "all 300 stored", func() bool { return rt.count(OutcomeStored) == 300 })
	testenv.Eventually(t, time.Minute, "every head run and the processing paused", func() (bool, error) {
		return rt.count(OutcomeRetried)+rt.count(OutcomeRequeued) >= 30 && rt.pauses() >= 1, nil
	})
	ready, unacked := e.brokerHolds()
	if ready != 0 || unacked != 0 {
		t.Errorf("during the outage the broker holds %d ready and %d unacked messages, want none", ready, unacked)
	}
	// The handler failing every message pauses the processing
	// (PauseAfterFailures): the heads go back without spending attempts.
	tried := rt.count(OutcomeRetried) + rt.count(OutcomeRequeued)
	if n := e.appliedTotal(); n != 0 || tried < 30 || rt.pauses() < 1 {
		t.Fatalf("during the outage: applied %d, runs failed %d, pauses %d; want nothing applied, every head run, a pause",
			n, tried, rt.pauses())
	}
	down.Store(false)
	testenv.Eventually(t, time.Minute, "all applied after the outage", func() (bool, error) { return e.appliedTotal() == 300, nil })
	e.assertInOrder(keys, 10)
	if n := e.statusCount(buffered.StatusParked); n != 0 {
		t.Errorf("%d parked", n)
	}
}

// brokerHolds reads the work queue's ready and unacknowledged messages.
func (e *env) brokerHolds() (ready, unacked int) {
	e.t.Helper()
	for _, q := range testenv.Queues(e.t, e.vhost) {
		if q.Name == e.topo.Queue {
			if !q.Counted {
				e.t.Fatalf("queue %s listed without counts: %+v", q.Name, q)
			}
			return q.Ready, q.Unacked
		}
	}
	e.t.Fatalf("queue %s not listed", e.topo.Queue)
	return 0, 0
}

// A parked message (its processing's retry budget spent, as
// TestRetryBudgetEndsGivenUp shows in both modes) gets a fresh budget from a
// retry (inboxctl inbox retry), and its key goes on in order.
func TestBufferedParkedRetryGetsAFreshBudget(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	var fixed atomic.Bool
	rt := e.start(orderedHandler(func(Message, event) error {
		if !fixed.Load() {
			return errTransient
		}
		return nil
	}), withBuffered(e.db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = 3 }))
	e.publishEvents([]string{"k"}, 2)
	// The row is parked at the commit, the metric counted just after it.
	waitFor(t, "the head parked, and counted", func() bool {
		return e.statusCount(buffered.StatusParked) == 1 && counterValue(rt.metrics.parked.WithLabelValues("test", string(wire.ReasonRetriesExhausted))) >= 1
	})
	if got := counterValue(rt.metrics.parked.WithLabelValues("test", string(wire.ReasonRetriesExhausted))); got != 1 || rt.count(OutcomeRetried) != 2 {
		t.Errorf("parked %d (retries_exhausted), retried %d: want 1 and 2", got, rt.count(OutcomeRetried))
	}
	fixed.Store(true)
	if n, err := buffered.New(e.db, "test").Retry(context.Background(), buffered.Selector{All: true}); n != 1 || err != nil {
		t.Fatalf("retry: %d %v", n, err)
	}
	waitFor(t, "both applied", func() bool { return e.appliedTotal() == 2 })
	e.assertInOrder([]string{"k"}, 2)
}

// The buffer's gauges follow the table.
func TestBufferedGauges(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	rt := e.start(orderedHandler(func(msg Message, ev event) error {
		if ev.N == 0 {
			return Permanent(NewReason("invalid_field"), nil)
		}
		return nil
	}), withBuffered(e.db, e.dbURL, nil))
	e.publishEvents(keyNames(2), 3)
	waitFor(t, "all stored", func() bool { return rt.count(OutcomeStored) == 6 })
	waitFor(t, "two parked heads", func() bool { return e.statusCount(buffered.StatusParked) == 2 })
	st, err := buffered.New(e.db, "test").Stats(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	rt.metrics.setBuffered("test", st)
	g := func(name string) float64 {
		m, err := rt.metrics.blockedKeys.GetMetricWithLabelValues("test")
		if name == "messages" {
			m, err = rt.metrics.blockedMessages.GetMetricWithLabelValues("test")
		}
		if err != nil {
			t.Fatal(err)
		}
		return gaugeValue(m)
	}
	if g("keys") != 2 || g("messages") != 4 {
		t.Errorf("blocked keys %v, messages %v: want 2 and 4", g("keys"), g("messages"))
	}
}

func gaugeValue(g interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if g.Write(&m) != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

// A replica that does not ingest (single active consumer: the other one
// does) learns of new messages through NOTIFY: with a poll interval of a
// minute, it still takes its share at once.
func TestBufferedNotifyWakesTheOtherReplicas(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, singleActive)
	slow := orderedHandler(func(Message, event) error { time.Sleep(100 * time.Millisecond); return nil })
	tune := withBuffered(e.db, e.dbURL, func(b *BufferedConfig) { b.PollInterval = time.Minute })
	ingesting := e.start(slow, func(c *Config) { tune(c); c.Workers = 1 })
	other := e.start(slow, func(c *Config) { tune(c); c.Workers = 8 })
	testenv.Eventually(t, 30*time.Second, "both asleep for the poll's minute, after a first claim, listening", func() (bool, error) {
		var listening int
		err := e.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'test listen' AND query ILIKE 'listen%'`).Row().Scan(&listening)
		return claims(t, ingesting) >= 1 && claims(t, other) >= 1 && listening == 2, err
	})
	e.publishEvents(keyNames(40), 1)
	testenv.Eventually(t, 20*time.Second, "all applied long before a poll", func() (bool, error) { return e.appliedTotal() == 40, nil })
	if ingesting.count(OutcomeStored) != 40 || other.count(OutcomeStored) != 0 {
		t.Fatalf("stored %d and %d: want one replica ingesting everything", ingesting.count(OutcomeStored), other.count(OutcomeStored))
	}
	if other.count(OutcomeProcessed) < 20 {
		t.Errorf("the replica that does not ingest processed %d of 40: NOTIFY did not wake it", other.count(OutcomeProcessed))
	}
}

// A handler that outlives its lease (it hung) commits nothing, even when it
// returns just as the handler of its key's next message does (claimed after
// another worker ran the first message again) and the finisher puts both in
// one group commit: each event is applied once, in order.
func TestHungHandlerBatchedWithTheNextMessageCommitsNothing(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	var runs0 atomic.Int32
	nextStarted := make(chan struct{})
	staleReturning := make(chan struct{})
	var onceA, onceB sync.Once
	h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		var ev event
		if err := json.Unmarshal(msg.Body, &ev); err != nil {
			return nil, Permanent(NewReason("malformed_json"), err)
		}
		switch {
		case ev.N == 0 && runs0.Add(1) == 1:
			<-nextStarted // hung past its lease, ignoring ctx
			onceA.Do(func() { close(staleReturning) })
		case ev.N == 1:
			onceB.Do(func() { close(nextStarted) })
			select {
			case <-staleReturning:
			case <-time.After(20 * time.Second):
			}
		}
		return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
			return OutcomeProcessed, tx.Exec(`INSERT INTO ordered (key, n, message_id) VALUES (?, ?, ?)`, ev.Key, ev.N, msg.ID).Error
		}, nil
	})
	rt := e.start(h, func(c *Config) {
		withBuffered(e.db, e.dbURL, func(b *BufferedConfig) { b.Lease = time.Second })(c)
		c.Workers, c.Committers, c.GroupCommitMax, c.GroupCommitWait = 4, 1, 8, 300*time.Millisecond
	})
	e.publishEvents([]string{"key-00"}, 2)
	testenv.Eventually(t, 30*time.Second, "both events applied", func() (bool, error) { return e.appliedTotal() >= 2, nil })
	testenv.Eventually(t, 30*time.Second, "the stale run's commit refused (or applied: the defect)", func() (bool, error) {
		return strings.Contains(rt.logs.String(), "the lease passed to another worker before the commit") || e.appliedTotal() > 2, nil
	})
	if got := fmt.Sprint(e.appliedOf("key-00")); got != "[0 1]" {
		t.Errorf("key-00 applied %s, want [0 1]", got)
	}
}

// A due message whose row an operator's transaction holds locked is skipped
// by every claim (FOR UPDATE SKIP LOCKED) while the table still reports it due:
// the claimer backs off instead of claiming in a loop every 10 ms, and takes
// the message once the lock is gone.
func TestBufferedClaimBacksOffWhileADueMessageIsLocked(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	store := buffered.New(e.db, "test")
	if _, err := store.Ingest(context.Background(), []buffered.Incoming{{
		MessageID: "locked-1", OrderingKey: "key-00", ContentType: "application/json", Body: []byte(`{"key":"key-00","n":1}`),
	}}, nil); err != nil {
		t.Fatal(err)
	}
	lock := e.db.Begin()
	if err := lock.Exec(`SELECT 1 FROM inbox_messages WHERE message_id = 'locked-1' FOR UPDATE`).Error; err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	rt := e.start(orderedHandler(nil), withBuffered(e.db, e.dbURL, nil))
	before := claims(t, rt)
	time.Sleep(3 * time.Second) // a window to count claims in
	n := claims(t, rt) - before
	t.Logf("%d claims in 3 s while the due message was locked", n)
	if n > 40 {
		t.Errorf("%d claims in 3 s while the only due message was locked: the claimer spins", n)
	}
	if err := lock.Rollback().Error; err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "applied once the lock is gone", func() (bool, error) { return e.appliedTotal() == 1, nil })
}

// claims is how many claims rt's buffered processing has made.
func claims(t *testing.T, rt *runtime) int {
	t.Helper()
	var m dto.Metric
	if err := rt.metrics.claimSeconds.WithLabelValues("test").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return int(m.GetHistogram().GetSampleCount())
}
