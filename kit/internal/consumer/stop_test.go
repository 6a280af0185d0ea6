package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// The stop's one budget, in the cases an outside review found it exceeded.

// stopTakes stops rt and returns how long the stop took.
func stopTakes(t *testing.T, rt *runtime, budget time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	rt.shutdown(t)
	took := time.Since(began)
	t.Logf("stopped in %s with a shutdown timeout of %s", took.Round(10*time.Millisecond), budget)
	return took
}

// Buffered: a handler cancelled when the budget runs out releases its
// message within what is left of it, even when the release waits (the
// message's row locked, as by an operator's transaction or a database that does not
// answer): the lease gives the message back later instead.
func TestBufferedStopSettlesWithinTheBudget(t *testing.T) {
	e := newBufferedEnv(t, nil)
	in := make(chan struct{}, 1)
	blocking := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		in <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	const budget = 4 * time.Second
	rt := e.start(blocking, func(c *Config) {
		c.ShutdownTimeout = budget
		withBuffered(e.db, e.dbURL, nil)(c)
	})
	e.publish("m1", `{"key":"k","n":1}`)
	<-in
	lock := e.db.Begin()
	if err := lock.Exec(`SELECT 1 FROM inbox_messages WHERE ordering_key = 'k' FOR UPDATE`).Error; err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	// Waiting for the lock would hold the stop without end, and a fresh
	// budget for the release would end it at 8 s: past 6 s, the stop had
	// more than its budget; a busy machine has 2 s.
	if took := stopTakes(t, rt, budget); took > budget*3/2 {
		t.Errorf("the stop took %s, more than its budget of %s (plus half)", took.Round(10*time.Millisecond), budget)
	}
}

// Inline: a stop that begins while a session ends for a pause (its drain
// under way, the return of its unstarted deliveries to come, refused here by
// a max-length policy as an alarm would hold it) keeps one budget from the
// moment it begins, not a fresh one per phase.
func TestStopDuringAPauseKeepsOneBudget(t *testing.T) {
	e := newEnv(t)
	gate := make(chan struct{})
	inStuck := make(chan struct{}, 1)
	h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		switch msg.ID {
		case "stuck":
			inStuck <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		case "gate":
			<-gate
			return nil, Pause(NewCause("dep_down"), errors.New("down"))
		}
		return recordWrites(msg), nil
	})
	const budget = 6 * time.Second
	rt := e.start(h, func(c *Config) { c.Workers, c.Prefetch, c.ShutdownTimeout = 2, 20, budget })
	e.publish("stuck", `{}`)
	<-inStuck
	e.publish("gate", `{}`)
	for i := range 10 {
		e.publish(fmt.Sprintf("rest-%d", i), `{}`)
	}
	waitFor(t, "all prefetched", func() bool { return e.queueDepth(e.topo.Queue) == 0 })
	testenv.Ctl(t, "set_policy", "-p", e.vhost, "--apply-to", "queues", "maxlen", "^work$", `{"max-length":1}`)
	close(gate) // the pause: the session ends, and its drain waits for "stuck"
	// Not ready: the session has ended, and its drain waits for "stuck".
	waitFor(t, "the pause", func() bool { return rt.Ready() != nil })
	// One budget for the drain and the return ends at 6 s, one per phase
	// at 12 s: a stop past 9 s had more than one, and a busy machine has 3 s.
	if took := stopTakes(t, rt, budget); took > budget*3/2 {
		t.Errorf("the stop took %s, more than its one budget of %s (plus half)", took.Round(10*time.Millisecond), budget)
	}
}

// One message failing alone must never pause: PAUSE_AFTER_FAILURES 1 would
// put it back, fail it, pause and call out again forever.
func TestPauseAfterOneFailureIsRefused(t *testing.T) {
	cfg := Config{Name: "x", AMQPURL: "amqp://", PauseAfterFailures: 1}
	cfg.setDefaults()
	if err := cfg.Validate(); err == nil {
		t.Fatal("PauseAfterFailures 1 accepted")
	}
}
