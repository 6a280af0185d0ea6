package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/wire"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, func() (bool, error) { return cond(), nil })
}

func TestDuplicateDeliveryIsAppliedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(nil), nil)
	e.publish("m-1", `{"n":1}`)
	e.publish("m-1", `{"n":1}`)
	waitFor(t, "one processed and one duplicate", func() bool {
		return rt.count(OutcomeProcessed) == 1 && rt.count(OutcomeDuplicate) == 1
	})
	if n := e.effects("m-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	if n := e.queueDepth(e.topo.Queue); n != 0 {
		t.Fatalf("%d messages left in the work queue", n)
	}
}

// Without a message_id property the key comes from the body, and dedupes the same way.
func TestKeyFromBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(nil), nil)
	for range 3 {
		e.publish("", "id:evt-7")
	}
	waitFor(t, "one processed, two duplicates", func() bool {
		return rt.count(OutcomeProcessed) == 1 && rt.count(OutcomeDuplicate) == 2
	})
	if n := e.effects("evt-7"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// Two service replicas receive the same message at the same moment.
func TestTwoConsumersApplyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	slow := recordHandler(func(Message) error { time.Sleep(2 * time.Millisecond); return nil })
	a := e.start(slow, nil)
	b := e.start(slow, nil)
	const n = 40
	for i := range n {
		id := fmt.Sprintf("pair-%d", i)
		e.publish(id, `{}`)
		e.publish(id, `{}`)
	}
	waitFor(t, "every message settled", func() bool {
		return a.count(OutcomeProcessed)+b.count(OutcomeProcessed) == n &&
			a.count(OutcomeDuplicate)+b.count(OutcomeDuplicate) == n
	})
	for i := range n {
		if got := e.effects(fmt.Sprintf("pair-%d", i)); got != 1 {
			t.Fatalf("pair-%d applied %d times", i, got)
		}
	}
	t.Logf("replica a processed %d, replica b processed %d", a.count(OutcomeProcessed), b.count(OutcomeProcessed))
}

func TestPoisonIsDeadLetteredAndConsumingGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(func(m Message) error {
		if strings.Contains(string(m.Body), "bad") {
			return Permanent(NewReason("invalid_amount"), fmt.Errorf("amount is bad"))
		}
		return nil
	}), func(c *Config) { c.MaxBodyBytes = 1024 })
	tests := []struct {
		id, body string
		mutate   func(*amqp.Publishing)
		reason   Reason
	}{
		{"p-big", strings.Repeat("x", 1025), nil, reasonBodyTooLarge},
		{"p-ct", `{}`, func(p *amqp.Publishing) { p.ContentType = "text/plain" }, reasonUnsupportedContent},
		{"", `{"no":"id"}`, nil, reasonMissingID},
		{"", "id:" + strings.Repeat("i", 300), nil, reasonInvalidID},
		{"p-bad", `{"bad":true}`, nil, kitReason("invalid_amount")},
	}
	for _, tt := range tests {
		mut := []func(*amqp.Publishing){}
		if tt.mutate != nil {
			mut = append(mut, tt.mutate)
		}
		e.publish(tt.id, tt.body, mut...)
	}
	e.publish("good", `{}`)
	got := e.deadLetters(len(tests))
	reasons := map[string]string{}
	for _, d := range got {
		reasons[d.MessageId+string(d.Body)] = fmt.Sprint(d.Headers[wire.HeaderDeadLetterReason])
		if d.Headers[wire.HeaderDeadLetterError] == nil {
			t.Errorf("%s: no %s header", d.MessageId, wire.HeaderDeadLetterError)
		}
	}
	for _, tt := range tests {
		if got := reasons[tt.id+tt.body]; got != tt.reason.String() {
			t.Errorf("message %.20q %.20q: reason %q, want %q", tt.id, tt.body, got, tt.reason)
		}
	}
	waitFor(t, "the good message after the poison", func() bool { return rt.count(OutcomeProcessed) == 1 })
	if e.effects("good") != 1 || e.effects("p-bad") != 0 {
		t.Fatal("good message not applied once, or poison applied")
	}
}

func TestTransientFailuresAreRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int32
	var attempts []int
	rt := e.start(recordHandler(func(m Message) error {
		calls.Add(1)
		attempts = append(attempts, m.Attempt) // handlers of one message never overlap
		if m.Attempt < 3 {
			return errTransient
		}
		return nil
	}), func(c *Config) { c.MaxAttempts = 5; c.Workers = 1; c.Prefetch = 1 })
	e.publish("flaky", `{}`)
	waitFor(t, "processed after retries", func() bool { return rt.count(OutcomeProcessed) == 1 })
	if rt.count(OutcomeRetried) != 2 || fmt.Sprint(attempts) != "[1 2 3]" {
		t.Fatalf("retried %d, attempts %v; want 2 retries, attempts [1 2 3]", rt.count(OutcomeRetried), attempts)
	}
	if e.effects("flaky") != 1 {
		t.Fatal("not applied once")
	}
}

// A message failing every run spends its retry budget and is given up on
// (dead-lettered inline, parked buffered) with reason retries_exhausted, its
// last error, the runs it had, and its id and body intact; every failed run
// but the last counts as retried.
func TestRetryBudgetEndsGivenUp(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		rt := e.start(recordHandler(func(Message) error { return errTransient }), m.budget(e, 4, nil))
		e.publish("doomed", `{}`)
		g := m.givenUp(e, 1)[0]
		if g.id != "doomed" || g.body != `{}` || g.reason != string(wire.ReasonRetriesExhausted) || g.attempts != 4 {
			t.Fatalf("given up: %+v; want doomed, body {}, %s after 4 runs", g, wire.ReasonRetriesExhausted)
		}
		if !strings.Contains(g.err, errTransient.Error()) {
			t.Fatalf("error %q, want the handler's", g.err)
		}
		// The counters move after the message is retried, parked or
		// dead-lettered, so they may lag what givenUp read: wait for the
		// give-up's, which moves after the last run, then check that each
		// counted once (a retry counted late would show here).
		given := func() int { return rt.count(OutcomeDeadLettered) }
		if m.acksAtIngest {
			given = func() int {
				return counterValue(rt.metrics.parked.WithLabelValues("test", string(wire.ReasonRetriesExhausted)))
			}
		}
		waitFor(t, "the given-up message counted", func() bool { return given() >= 1 })
		if got := given(); got != 1 {
			t.Fatalf("given up counted %d times, want 1 (parked buffered, dead-lettered inline)", got)
		}
		if got := rt.count(OutcomeRetried); got != 3 {
			t.Fatalf("retried %d times, want 3", got)
		}
		if e.effects("doomed") != 0 {
			t.Fatal("a failed run committed its effect")
		}
	})
}

func TestPanicIsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(func(m Message) error {
		if m.Attempt == 1 {
			panic("nil map")
		}
		return nil
	}), nil)
	e.publish("panicky", `{}`)
	waitFor(t, "processed on the second attempt", func() bool { return rt.count(OutcomeProcessed) == 1 })
	if e.effects("panicky") != 1 || rt.count(OutcomeRetried) != 1 {
		t.Fatal("panic not retried once")
	}
}

// A handler that reports the effect already present (same order, new id)
// commits its inbox row and is counted as a duplicate.
func TestHandlerDuplicateOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(HandlerFunc(func(context.Context, Message) (Writes, error) {
		return func(context.Context, *gorm.DB) (Outcome, error) { return OutcomeDuplicate, nil }, nil
	}), nil)
	e.publish("dup-of-order", `{}`)
	waitFor(t, "duplicate", func() bool { return rt.count(OutcomeDuplicate) == 1 })
	var n int64
	e.db.Table("inbox").Where("message_id = ?", "dup-of-order").Count(&n)
	if n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
}

// A producer bug: the same message id with another body. The second is not
// silently dropped as a duplicate: it is dead-lettered as payload_mismatch.
func TestSameIDDifferentPayloadIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(nil), nil)
	e.publish("reused", `{"amount":100}`)
	waitFor(t, "first processed", func() bool { return rt.count(OutcomeProcessed) == 1 })
	e.publish("reused", `{"amount":999}`)
	d := e.deadLetters(1)[0]
	if d.Headers[wire.HeaderDeadLetterReason] != wire.ReasonPayloadMismatch || string(d.Body) != `{"amount":999}` {
		t.Fatalf("dead letter %q with reason %v, want the second body with %s", d.Body, d.Headers[wire.HeaderDeadLetterReason], wire.ReasonPayloadMismatch)
	}
	// The copy is visible in the queue just before the runtime acks and counts it.
	mismatches := func() int {
		return counterValue(rt.metrics.deadLetters.WithLabelValues(rt.cfg.Name, string(wire.ReasonPayloadMismatch)))
	}
	waitFor(t, "the dead letter counted", func() bool { return mismatches() == 1 })
	got := mismatches()
	if got != 1 || e.effects("reused") != 1 || rt.count(OutcomeDuplicate) != 0 {
		t.Fatalf("payload_mismatch counted %d, effects %d, duplicates %d", got, e.effects("reused"), rt.count(OutcomeDuplicate))
	}
}

// A PermanentError built without a cause still dead-letters with its reason.
func TestBarePermanentError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(HandlerFunc(func(context.Context, Message) (Writes, error) {
		return nil, &PermanentError{Reason: kitReason("bad_sku")}
	}), nil)
	e.publish("sku", `{}`)
	if d := e.deadLetters(1)[0]; d.Headers[wire.HeaderDeadLetterReason] != "bad_sku" {
		t.Fatalf("reason %v, want bad_sku", d.Headers[wire.HeaderDeadLetterReason])
	}
}

// Errors are told apart by what they say, not by a ping: the database's own
// trouble (an SQLSTATE of its class) puts the message back without spending
// an attempt and pauses; a violation the writes cause is the message's, and is
// retried.
func TestDatabaseErrorsClassifiedBySQLState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var first atomic.Bool
	first.Store(true)
	rt := e.start(HandlerFunc(func(ctx context.Context, m Message) (Writes, error) {
		if m.ID == "busy" && first.CompareAndSwap(true, false) {
			return nil, fmt.Errorf("read the order: %w", &pgconn.PgError{Code: "53300", Message: "too many connections"})
		}
		return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
			if m.ID == "clash" && m.Attempt == 1 {
				return "", tx.Exec(`INSERT INTO inbox (message_id, consumer, payload_sha256) VALUES ('clash', 'test', sha256(''))`).Error // 23505
			}
			return recordWrites(m)(ctx, tx)
		}, nil
	}), nil)
	e.publish("busy", `{}`)
	e.publish("clash", `{}`)
	waitFor(t, "both processed", func() bool { return rt.count(OutcomeProcessed) == 2 })
	if rt.count(OutcomeRequeued) != 1 || rt.pauses() != 1 {
		t.Errorf("requeued %d, pauses %d: want busy put back once, with one pause", rt.count(OutcomeRequeued), rt.pauses())
	}
	if rt.count(OutcomeRetried) != 1 {
		t.Errorf("retried %d: want clash retried once", rt.count(OutcomeRetried))
	}
	if !strings.Contains(rt.logs.String(), `"attempt":1,"max_attempts"`) {
		t.Error("no retry of clash logged at attempt 1")
	}
}

func TestPauseCause(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want Cause
	}{
		{"dependency", fmt.Errorf("charge: %w", Pause(NewCause("gateway_misconfigured"), errors.New("401"))), NewCause("gateway_misconfigured")},
		{"read-only", failedAt(stepCommit, &pgconn.PgError{Code: "25006"}), CauseDatabase},
		{"disk full", failedAt(stepCommit, &pgconn.PgError{Code: "53100"}), CauseDatabase},
		{"statement timeout: waited, no pause", failedAt(stepLookup, &pgconn.PgError{Code: "57014"}), Cause{}},
		{"lock timeout: waited, no pause", failedAt(stepCommit, &pgconn.PgError{Code: "55P03"}), Cause{}},
		{"admin shutdown", failedAt(stepCommit, &pgconn.PgError{Code: "57P01"}), CauseDatabase},
		{"schema missing", failedAt(stepCommit, &pgconn.PgError{Code: "42P01"}), CauseDatabase},
		{"handler's own database", failedAt(stepHandler, &pgconn.PgError{Code: "08006"}), CauseDatabase},
		{"unique violation", failedAt(stepCommit, &pgconn.PgError{Code: "23505"}), Cause{}},
		{"bad data", failedAt(stepCommit, &pgconn.PgError{Code: "22021"}), Cause{}},
		{"connection dropped at commit", failedAt(stepCommit, io.ErrUnexpectedEOF), CauseDatabase},
		{"look-up timed out", failedAt(stepLookup, context.DeadlineExceeded), CauseDatabase},
		{"gateway unreachable", failedAt(stepHandler, &net.OpError{Op: "dial", Err: errors.New("refused")}), Cause{}},
		{"writes' own error", failedAt(stepCommit, errors.New("unknown sku")), Cause{}},
	}
	for _, tt := range tests {
		if got := pauseCause(tt.err); got != tt.want {
			t.Errorf("%s: cause %q, want %q", tt.name, got, tt.want)
		}
	}
	for _, code := range []string{"55P03", "57014", "40001", "40P01"} {
		if !waited(failedAt(stepCommit, &pgconn.PgError{Code: code})) {
			t.Errorf("%s: not taken for waiting", code)
		}
	}
	if waited(failedAt(stepCommit, &pgconn.PgError{Code: "23505"})) {
		t.Error("a unique violation taken for waiting")
	}
}

// A dependency that fails every message alike (consumer.Pause) puts the
// message back without spending an attempt and pauses consuming (buffered:
// processing; its ingest goes on storing), which readiness names; once the
// dependency is back every message is applied, none retried, dead-lettered
// or parked.
func TestDependencyPauseSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		var broken atomic.Bool
		broken.Store(true)
		rt := e.start(orderedHandler(func(Message, event) error {
			if broken.Load() {
				return Pause(NewCause("gateway_misconfigured"), errors.New("gateway answered 401 Unauthorized"))
			}
			return nil
		}), func(c *Config) {
			m.config(e.db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = 2 })(c)
			c.MaxAttempts, c.ReconnectMaxWait = 1, 300*time.Millisecond
		})
		keys := keyNames(5)
		e.publishEvents(keys, 4)
		waitFor(t, "readiness to name the cause", func() bool {
			err := rt.Ready()
			return err != nil && strings.Contains(err.Error(), "gateway_misconfigured")
		})
		paused := rt.Collectors()[0]
		if v := testutil.ToFloat64(paused); v != 1 {
			t.Errorf("consumer_paused = %v while paused, want 1", v)
		}
		if m.acksAtIngest {
			waitFor(t, "all stored while paused", func() bool { return rt.count(OutcomeStored) == 20 })
		}
		broken.Store(false)
		testenv.Eventually(t, time.Minute, "all applied after the pause", func() (bool, error) { return e.appliedTotal() == 20, nil })
		m.assertEventsApplied(e, keys, 4)
		if rt.count(OutcomeRetried) != 0 || rt.count(OutcomeDeadLettered) != 0 {
			t.Errorf("retried %d, dead-lettered %d: a pause must not spend the budget", rt.count(OutcomeRetried), rt.count(OutcomeDeadLettered))
		}
		if !m.acksAtIngest && rt.count(OutcomeRequeued) == 0 {
			t.Error("nothing requeued: the held deliveries were not put back")
		}
		if n := counterValue(rt.metrics.pauses.WithLabelValues(rt.cfg.Name, "gateway_misconfigured")); n < 1 {
			t.Errorf("pauses{cause=gateway_misconfigured} = %d", n)
		}
		waitFor(t, "ready again", func() bool { return rt.Ready() == nil })
		if v := testutil.ToFloat64(paused); v != 0 {
			t.Errorf("consumer_paused = %v once resumed, want 0", v)
		}
	})
}

// A handler that returns Pause for one message that is itself bad (every
// other message goes through) used to put it back without spending an
// attempt and pause the whole consumer every cycle, until the key's lifetime
// ended it, or forever for a service without one. After MaxHolds holds it is
// the message's own fault: dead-lettered (buffered: parked) held_too_often,
// after exactly MaxHolds pauses, and every other message is applied.
func TestPauseForOneMessageEndsAfterMaxHolds(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		const maxHolds = 3
		var runs atomic.Int64
		rt := e.start(orderedHandler(func(_ Message, ev event) error {
			if ev.Key != "bad" {
				return nil
			}
			runs.Add(1)
			return Pause(NewCause("gateway_misconfigured"), errors.New("the gateway refuses this one message"))
		}), func(c *Config) {
			m.config(e.db, e.dbURL, nil)(c)
			c.MaxHolds, c.ReconnectMaxWait = maxHolds, 300*time.Millisecond
		})
		e.publish("bad-0", `{"key":"bad","n":0}`)
		keys := keyNames(3)
		e.publishEvents(keys, 4)
		got := m.givenUp(e, 1)
		if len(got) != 1 || got[0].id != "bad-0" || got[0].reason != wire.ReasonHeldTooOften || !strings.Contains(got[0].err, "gateway_misconfigured") {
			t.Fatalf("given up on %+v, want bad-0 with %s and the handler's error", got, wire.ReasonHeldTooOften)
		}
		testenv.Eventually(t, time.Minute, "every other message applied", func() (bool, error) { return e.appliedTotal() == 12, nil })
		if m.orderPerKey {
			e.assertInOrder(keys, 4)
		}
		if n := runs.Load(); n != maxHolds+1 {
			t.Errorf("the bad message ran %d times, want %d: held %d times, then given up", n, maxHolds+1, maxHolds)
		}
		// Each hold asks for a pause; a hold that comes while a pause is
		// starting joins it (buffered mode: another worker claimed the
		// released message first, as a run under a CPU hog showed: 3 holds,
		// 2 pauses). So at least one pause, at most one a hold.
		if n := counterValue(rt.metrics.pauses.WithLabelValues(rt.cfg.Name, "gateway_misconfigured")); n < 1 || n > maxHolds {
			t.Errorf("%d pauses, want 1 to %d (one a hold at most)", n, maxHolds)
		}
		if rt.count(OutcomeRetried) != 0 {
			t.Errorf("%d retried: a hold spends no attempt", rt.count(OutcomeRetried))
		}
		waitFor(t, "ready, the bad message gone", func() bool { return rt.Ready() == nil })
	})
}

// The dead-letter queue is gone (deleted by hand): the broker would confirm
// the copy and drop it, so the runtime publishes it mandatory, keeps the
// original, and ends its session: the next one declares the queue again, and
// the message is dead-lettered there.
func TestDeadLetterCopyNoQueueTookIsNotAcked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(nil), func(c *Config) { c.MaxBodyBytes = 16 })
	// The runtime declared its topology at start; delete the queue after that.
	if _, err := e.channel().QueueDelete(e.topo.DeadLetterQueue, false, false, false); err != nil {
		t.Fatal(err)
	}
	e.publish("too-big", `{"pad":"xxxxxxxxxxxxxxxx"}`)
	waitFor(t, "a refused move", func() bool { return strings.Contains(rt.logs.String(), "could not move the message") })
	waitFor(t, "the queue declared again, without a restart", func() bool {
		ch, err := e.conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		_, err = ch.QueueDeclarePassive(e.topo.DeadLetterQueue, true, false, false, false, nil)
		return err == nil
	})
	d := e.deadLetters(1)[0]
	if d.MessageId != "too-big" || d.Headers[wire.HeaderDeadLetterReason] != wire.ReasonBodyTooLarge {
		t.Fatalf("dead letter %q with reason %v", d.MessageId, d.Headers[wire.HeaderDeadLetterReason])
	}
	if rt.reconnects() < 1 {
		t.Error("no new session after the returned copy")
	}
}

// A panicking LogAttrs costs the log attributes only: the message is settled
// once (a second settlement would close the channel: unknown delivery tag).
func TestLogAttrsPanicCostsOnlyTheAttributes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(nil), func(c *Config) {
		c.LogAttrs = func([]byte) []slog.Attr { panic("bad attrs") }
	})
	for i := range 5 {
		e.publish(fmt.Sprintf("p-%d", i), `{}`)
	}
	e.publish("p-0", `{}`) // a duplicate: logged at info, so LogAttrs runs
	waitFor(t, "processed and the duplicate", func() bool {
		return rt.count(OutcomeProcessed) == 5 && rt.count(OutcomeDuplicate) == 1
	})
	if rt.reconnects() != 0 || strings.Contains(rt.logs.String(), "unknown delivery tag") {
		t.Fatalf("%d reconnects: a delivery was settled twice", rt.reconnects())
	}
}

// The key-expiry guard comes after the inbox look-up: an old redelivery of a
// message applied already is a duplicate, not a dead letter.
func TestOldRedeliveryOfAnAppliedMessageIsADuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(nil), func(c *Config) { c.KeyTTL = time.Hour })
	old := time.Now().Add(-2 * time.Hour)
	e.publish("applied-old", `{}`, func(p *amqp.Publishing) { p.Timestamp = old })
	waitFor(t, "processed", func() bool { return rt.count(OutcomeProcessed) == 1 })
	e.publish("applied-old", `{}`, func(p *amqp.Publishing) {
		p.Timestamp = old
		p.Headers = amqp.Table{wire.HeaderHeld: int32(1)}
	})
	waitFor(t, "the duplicate", func() bool { return rt.count(OutcomeDuplicate) == 1 })
	if rt.count(OutcomeDeadLettered) != 0 {
		t.Fatal("an applied message was dead-lettered as key-expired")
	}
}

// A worker that hangs on a delivery (a handler ignoring its context, say)
// makes the replica not ready while it holds the message, and ready again once
// the work moves.
func TestReadinessFailsWhileWorkersAreStuck(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	stuck := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		<-release // ignores ctx on purpose: a wedge
		return NoWrites(OutcomeProcessed), nil
	})
	rt := e.start(stuck, func(c *Config) { c.StallTimeout = 300 * time.Millisecond })
	e.publish("m-1", `{"n":1}`)
	waitFor(t, "readiness to report the stall", func() bool {
		err := rt.Ready()
		return err != nil && strings.Contains(err.Error(), "stalled")
	})
	stalled := rt.Collectors()[1]
	if v := testutil.ToFloat64(stalled); v < 0.3 {
		t.Errorf("consumer_stalled_seconds = %v while stalled past 300ms, want at least 0.3", v)
	}
	close(release)
	waitFor(t, "the message processed", func() bool { return rt.count(OutcomeProcessed) == 1 })
	if err := rt.Ready(); err != nil {
		t.Fatalf("not ready after the work moved on: %v", err)
	}
	waitFor(t, "consumer_stalled_seconds back to 0", func() bool { return testutil.ToFloat64(stalled) == 0 })
}

// Group commit: messages that finish together share a transaction, and one
// whose writes fail rolls back alone and takes its own path (dead letter,
// retry) while the rest of its batch commits.
func TestGroupCommitIsolatesAFailingMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var flaky atomic.Int32
	h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		record := recordWrites(msg)
		return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
			if _, err := record(ctx, tx); err != nil {
				return "", err
			}
			switch {
			case msg.ID == "bad":
				return "", Permanent(NewReason("bad_row"), errors.New("rejected by the writes"))
			case msg.ID == "flaky" && flaky.Add(1) == 1:
				return "", tx.Exec(`SELECT 1/0`).Error // a failed statement aborts the transaction
			}
			return OutcomeProcessed, nil
		}, nil
	})
	rt := e.start(h, func(c *Config) {
		c.Workers, c.Prefetch, c.Committers = 16, 32, 1
		c.GroupCommitMax, c.GroupCommitWait = 32, 200*time.Millisecond
	})
	ids := []string{"a", "b", "bad", "c", "flaky", "d", "e"}
	ch := e.channel()
	for _, id := range ids { // unconfirmed, back to back: they reach the workers together
		if err := ch.Publish(e.topo.Exchange, e.topo.RoutingKey, false, false, amqp.Publishing{
			MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if d := e.deadLetters(1)[0]; d.MessageId != "bad" || d.Headers[wire.HeaderDeadLetterReason] != "bad_row" {
		t.Fatalf("dead letter %s with reason %v, want bad with bad_row", d.MessageId, d.Headers[wire.HeaderDeadLetterReason])
	}
	waitFor(t, "the others processed, flaky after its retry", func() bool { return rt.count(OutcomeProcessed) == len(ids)-1 })
	for _, id := range ids {
		want := 1
		if id == "bad" {
			want = 0
		}
		if got := e.effects(id); got != want {
			t.Errorf("effects of %s = %d, want %d", id, got, want)
		}
	}
	if rt.count(OutcomeRetried) != 1 {
		t.Errorf("retried %d, want 1 (flaky)", rt.count(OutcomeRetried))
	}
	var h2 dto.Metric
	if err := rt.metrics.batchSize.WithLabelValues(rt.cfg.Name).(prometheus.Histogram).Write(&h2); err != nil {
		t.Fatal(err)
	}
	if n, sum := h2.GetHistogram().GetSampleCount(), h2.GetHistogram().GetSampleSum(); n >= uint64(sum) {
		t.Errorf("%d transactions for %v messages: no batch held more than one", n, sum)
	}
}

// A duplicate right behind its original, on one replica: the second waits for
// the first instead of calling the handler beside it, then is suppressed by
// the look-up. The handler runs once.
func TestConcurrentDuplicateWaitsForTheFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int32
	h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		calls.Add(1)
		time.Sleep(200 * time.Millisecond) // an outside call
		return recordWrites(msg), nil
	})
	rt := e.start(h, func(c *Config) { c.Workers, c.Prefetch = 8, 8 })
	e.publish("twice", `{}`)
	e.publish("twice", `{}`)
	waitFor(t, "one processed, one duplicate", func() bool {
		return rt.count(OutcomeProcessed) == 1 && rt.count(OutcomeDuplicate) == 1
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once", n)
	}
}

// A producer's own x-attempt header is not trusted: only a message the broker
// brought back from one of our delay queues carries an attempt count of ours.
// Otherwise a message published with x-attempt 5 would get a single try.
func TestProducerAttemptHeaderIsIgnored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(func(m Message) error {
		if m.Attempt < 3 {
			return errTransient
		}
		return nil
	}), func(c *Config) { c.MaxAttempts = 3 })
	e.publish("forged", `{}`, func(p *amqp.Publishing) { p.Headers = amqp.Table{wire.HeaderAttempt: int32(5)} })
	waitFor(t, "processed on the third attempt", func() bool { return rt.count(OutcomeProcessed) == 1 })
	if rt.count(OutcomeRetried) != 2 || rt.count(OutcomeDeadLettered) != 0 {
		t.Fatalf("retried %d, dead-lettered %d: want two retries, no dead letter", rt.count(OutcomeRetried), rt.count(OutcomeDeadLettered))
	}
}

// MAX_BODY_BYTES is checked after the whole body arrived: the broker sends it
// entire (its own max_message_size, 128 MiB by default, is the only earlier
// cap), so the dead letter carries every byte. The Compose stack caps it at
// the broker; the disruptive suite shows that cap refusing the publish.
func TestOversizeBodyArrivesWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(recordHandler(nil), func(c *Config) { c.MaxBodyBytes = 64 << 10 })
	big := strings.Repeat("x", 2<<20)
	e.publish("huge", big)
	d := e.deadLetters(1)[0]
	if d.Headers[wire.HeaderDeadLetterReason] != wire.ReasonBodyTooLarge || len(d.Body) != len(big) {
		t.Fatalf("reason %v, %d bytes: want body_too_large with all %d bytes, received whole", d.Headers[wire.HeaderDeadLetterReason], len(d.Body), len(big))
	}
}

// The key-expiry guard, in both modes: a message older than the key lifetime
// of the services the handler calls is run once at most. A fresh one of that
// age is processed (it never called out); one put back after it may have
// run, and one whose first run failed, are given up on with key_expired
// (dead-lettered inline, parked buffered) instead of calling again with a key
// the called service may have forgotten.
func TestOldMessageIsNotCalledAgainWithAForgottenKey(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		var runs sync.Map
		h := recordHandler(func(msg Message) error {
			n, _ := runs.LoadOrStore(msg.ID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			if msg.ID == "fails-once-old" {
				return errTransient
			}
			return nil
		})
		rt := e.start(h, m.budget(e, 5, func(c *Config) { c.KeyTTL = time.Hour }))
		old := time.Now().Add(-2 * time.Hour)
		e.publish("fresh-but-old", `{}`, func(p *amqp.Publishing) { p.Timestamp = old })
		e.publish("redelivered-old", `{}`, func(p *amqp.Publishing) {
			p.Timestamp = old
			p.Headers = amqp.Table{wire.HeaderHeld: int32(1)} // put back once, after it may have called out
		})
		e.publish("fails-once-old", `{}`, func(p *amqp.Publishing) { p.Timestamp = old })
		got := m.givenUp(e, 2)
		if len(got) != 2 || got[0].id != "fails-once-old" || got[1].id != "redelivered-old" {
			t.Fatalf("given up: %+v; want fails-once-old and redelivered-old", got)
		}
		for _, g := range got {
			if g.reason != string(wire.ReasonKeyExpired) {
				t.Errorf("%s given up with %q, want %s", g.id, g.reason, wire.ReasonKeyExpired)
			}
		}
		waitFor(t, "the fresh one processed", func() bool { return rt.count(OutcomeProcessed) == 1 })
		count := func(id string) int64 {
			if n, ok := runs.Load(id); ok {
				return n.(*atomic.Int64).Load()
			}
			return 0
		}
		if count("redelivered-old") != 0 || count("fails-once-old") != 1 || count("fresh-but-old") != 1 {
			t.Errorf("runs: redelivered-old %d, fails-once-old %d, fresh-but-old %d; want 0, 1, 1",
				count("redelivered-old"), count("fails-once-old"), count("fresh-but-old"))
		}
		if e.effects("fresh-but-old") != 1 || e.effects("redelivered-old") != 0 || e.effects("fails-once-old") != 0 {
			t.Error("wrong message applied")
		}
	})
}

// A redelivered delivery (it may have run in a replica that died) waits
// unstarted in a replica's prefetch when that replica stops: the copy the
// stop returns to the work queue is a new message to the broker, without the
// redelivered flag, so it must carry wire.HeaderMayHaveRun, or the next replica
// would take an old one for a first attempt and call out with a key the
// called service may have forgotten.
func TestReturnedRedeliveryKeepsTheKeyExpiryGuard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	old := time.Now().Add(-2 * time.Hour)
	e.publish("redelivered", `{}`, func(p *amqp.Publishing) { p.Timestamp = old })
	dead := e.channel() // a replica that takes the message and dies
	if _, ok, err := dead.Get(e.topo.Queue, false); err != nil || !ok {
		t.Fatalf("get: %v, %v", ok, err)
	}
	e.publish("blocker", `{}`)
	release := make(chan struct{})
	var calls sync.Map
	h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		n, _ := calls.LoadOrStore(msg.ID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if msg.ID == "blocker" {
			<-release
		}
		return recordWrites(msg), nil
	})
	guard := func(c *Config) { c.Workers, c.KeyTTL = 1, time.Hour }
	rt := e.start(h, guard)
	waitFor(t, "the blocker in the only worker", func() bool { _, ok := calls.Load("blocker"); return ok })
	if err := dead.Close(); err != nil { // the broker redelivers the message to rt, behind the blocker
		t.Fatal(err)
	}
	waitFor(t, "the redelivery in rt's prefetch", func() bool {
		ready, unacked := e.brokerHolds()
		return ready == 0 && unacked == 2
	})
	go func() { // the blocker ends once the stop has begun
		select {
		case <-rt.stopping:
		case <-time.After(time.Minute):
			t.Error("the stop did not begin within a minute")
		}
		close(release)
	}()
	rt.shutdown(t)
	if !strings.Contains(rt.logs.String(), "returned unstarted deliveries") {
		t.Fatal("the redelivery was not returned by the stop")
	}

	e.start(h, guard) // stopped at the test's end
	d := e.deadLetters(1)[0]
	if d.MessageId != "redelivered" || d.Headers[wire.HeaderDeadLetterReason] != wire.ReasonKeyExpired {
		t.Fatalf("dead letter %s with reason %v, want redelivered with %s", d.MessageId, d.Headers[wire.HeaderDeadLetterReason], wire.ReasonKeyExpired)
	}
	if _, ran := calls.Load("redelivered"); ran || e.effects("redelivered") != 0 {
		t.Fatal("the returned copy ran as a first attempt")
	}
}
