//go:build disruptive

package consumer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// This file holds tests that disturb the whole broker, not just their vhost.
// They are built only with -tags disruptive and run on their own, after the
// main suite (see the Makefile's test target).

// A memory alarm blocks every connection that publishes. Retry copies are
// published on a connection of their own, so the consuming connection keeps
// acking and every message that succeeds is settled during the alarm; the
// failed ones are retried once the alarm clears. With one shared connection,
// the first retry publish would stop the broker from reading the acks.
func TestDisruptiveMemoryAlarmDoesNotStopAcks(t *testing.T) {
	e := newEnv(t)
	const n = 200
	e.publishMany(n, "alarm")
	clearAlarm := testenv.MemoryAlarm(t)
	failing := func(m Message) bool { return strings.HasSuffix(m.ID, "7") && m.Attempt == 1 } // 20 of 200
	rt := e.start(recordHandler(func(m Message) error {
		if failing(m) {
			return errTransient
		}
		return nil
	}), func(c *Config) { c.Workers = 32; c.Prefetch = 64 })
	const fail = n / 10 // ids ending in 7
	waitFor(t, "every succeeding message applied during the alarm", func() bool {
		_, d := e.applied()
		return d == n-fail
	})
	if v := testutil.ToFloat64(rt.metrics.blocked.WithLabelValues(rt.cfg.Name)); v != 1 {
		t.Errorf("consumer_publishing_blocked = %v during the alarm, want 1", v)
	}
	clearAlarm()
	e.assertAllAppliedOnce(n, 2*time.Minute)
}

// The same alarm with the buffered inbox: the ingest is one loop, and a
// delivery it must dead-letter waits for the publishing connection to be
// unblocked. It waits off the loop, so every valid message behind it is still
// stored, acked and applied during the alarm; the dead letters follow once
// the alarm clears.
func TestDisruptiveMemoryAlarmBufferedIngestGoesOn(t *testing.T) {
	e := newBufferedEnv(t, nil)
	keys := keyNames(5)
	e.publishEvents(keys[:2], 10)
	for range 3 {
		e.publish("", `{"key":"key-09","n":0}`) // no message id: dead-lettered at ingest
	}
	e.publishEvents(keys[2:], 10)
	clearAlarm := testenv.MemoryAlarm(t)
	rt := e.start(orderedHandler(nil), func(c *Config) {
		withBuffered(e.db, e.dbURL, nil)(c)
		c.Prefetch = 64
	})
	waitFor(t, "every valid event stored and applied during the alarm", func() bool {
		return rt.count(OutcomeStored) == 50 && e.appliedTotal() == 50
	})
	if v := testutil.ToFloat64(rt.metrics.blocked.WithLabelValues(rt.cfg.Name)); v != 1 {
		t.Errorf("consumer_publishing_blocked = %v during the alarm, want 1", v)
	}
	clearAlarm()
	for _, d := range e.deadLetters(3) {
		if r := d.Headers[wire.HeaderDeadLetterReason]; r != wire.ReasonMissingID {
			t.Errorf("dead letter with reason %v, want %s", r, wire.ReasonMissingID)
		}
	}
	e.assertInOrder(keys, 10)
}

// The broker's max_message_size refuses an oversize publish before any
// consumer holds it in memory: the cap the Compose stack sets.
func TestDisruptiveBrokerCapsMessageSize(t *testing.T) {
	e := newEnv(t)
	old := strings.TrimSpace(testenv.Eval(t, "application:get_env(rabbit, max_message_size)."))
	testenv.Eval(t, "application:set_env(rabbit, max_message_size, 1048576).")
	t.Cleanup(func() {
		if v, ok := strings.CutPrefix(old, "{ok,"); ok {
			testenv.Eval(t, "application:set_env(rabbit, max_message_size, "+strings.TrimSuffix(v, "}")+").")
		} else {
			testenv.Eval(t, "application:unset_env(rabbit, max_message_size).")
		}
	})
	ch := e.channel()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	err := rabbit.PublishConfirmed(context.Background(), ch, e.topo.Exchange, e.topo.RoutingKey,
		amqp.Publishing{MessageId: "huge", Body: make([]byte, 2<<20)})
	if err == nil {
		t.Fatal("a 2 MiB publish was accepted with max_message_size 1 MiB")
	}
	if n := e.queueDepth(e.topo.Queue); n != 0 {
		t.Fatalf("%d messages in the work queue, want none", n)
	}
}

// A graceful stop has one budget, SHUTDOWN_TIMEOUT, for all of its phases:
// the drain of the workers and the return of the unstarted deliveries share
// it. Here the only worker holds a message until it is cancelled and a
// memory alarm keeps the return from being confirmed, so each phase would
// take the whole timeout on its own: the stop still ends within one timeout
// (plus a margin), and what was not returned goes back with the channel.
func TestDisruptiveStopEndsWithinOneShutdownTimeout(t *testing.T) {
	e := newEnv(t)
	e.publish("held", `{}`)
	e.publish("unstarted", `{}`)
	started := make(chan struct{}, 1)
	var first atomic.Bool
	first.Store(true)
	h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		if msg.ID == "held" && first.CompareAndSwap(true, false) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return recordWrites(msg), nil
	})
	const timeout = 6 * time.Second
	rt := e.start(h, func(c *Config) { c.Workers, c.Prefetch, c.ShutdownTimeout = 1, 4, timeout })
	<-started
	waitFor(t, "both delivered", func() bool { return e.queueDepth(e.topo.Queue) == 0 })
	clearAlarm := testenv.MemoryAlarm(t)
	began := time.Now()
	rt.shutdown(t)
	took := time.Since(began)
	t.Logf("stopped in %s with a shutdown timeout of %s", took.Round(time.Millisecond), timeout)
	// One budget for both phases, then the close of the blocked connections
	// (closeTimeout), ends at 8 s; one budget per phase at 14 s: a stop past
	// 11 s had more than one, and a busy machine has 3 s.
	if took > timeout*3/2+closeTimeout {
		t.Errorf("the stop took %s, more than its one budget of %s (plus half) and the close's %s", took.Round(time.Millisecond), timeout, closeTimeout)
	}
	clearAlarm()
	rt = e.start(h, nil)
	waitFor(t, "both applied after the restart", func() bool { return e.effects("unstarted") == 1 && e.effects("held") == 1 })
}
