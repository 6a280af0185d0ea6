package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/bench/internal/broker"
	"github.com/inbox-template/payment-service/bench/internal/load"
	"github.com/inbox-template/payment-service/bench/internal/proc"
	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

// result is one row of the table.
type result struct {
	name     string
	label    string
	settings string
	rate     float64 // messages (pgbench: transactions) per second, or units per second
	unit     string  // what rate and the CPU columns count if not messages ("events", "payments"): no ratio to the plain consumer
	ingest   float64 // messages per second off the work queue: until none was ready
	drained  int     // messages in the drain
	paced    pacedPhase
	lat      quantiles
	rss      int64         // bytes; 0 if not measured
	cpu      cpuPerMessage // over the drain
	instr    float64       // the consumer's instructions per message over the drain; 0 if not counted
	conns    scratchdb.Connections
	note     string // what the configuration measured beyond the table's columns
	err      error
}

// quantiles are publish→commit in milliseconds over the paced phase.
type quantiles struct {
	n                int // samples; 0 if not measured
	p50, p99         float64
	above50, above99 bool   // in the histogram's +Inf bucket: at least the value
	method           string // "exact" or "histogram"
}

// consumer is one program under test that drains the queue.
type consumer interface {
	// label names the configuration in the table, settings lists its knobs.
	label() string
	settings() string
	// prepare starts what the consumer needs before the clock starts.
	prepare(ctx context.Context, st *stage) error
	// start starts the consumer process.
	start(ctx context.Context, st *stage) (*proc.Process, error)
	// pacedStarts marks the beginning of the paced phase.
	pacedStarts(ctx context.Context) error
	// finish stops the consumer and returns publish→commit of the messages
	// published since.
	finish(ctx context.Context, since time.Time) (quantiles, error)
	// stop ends whatever still runs; safe to call at any time.
	stop()
}

// runConsumer measures one consumer: pre-fill, drain, paced phase.
func (b *bench) runConsumer(ctx context.Context, name string, c consumer) (r result) {
	r = result{name: name, label: c.label(), settings: c.settings()}
	st, cleanup, err := b.newStage(ctx, name, broker.Declare)
	if err != nil {
		r.err = err
		return r
	}
	defer cleanup()
	defer c.stop()
	r.err = b.measure(ctx, st, c, &r)
	if n, ok := c.(interface{ note() string }); ok && r.err == nil {
		r.note = n.note()
	}
	return r
}

func (b *bench) measure(ctx context.Context, st *stage, c consumer, r *result) error {
	prefill := load.Batch{Run: st.run, Count: b.o.messages, DuplicateRate: b.o.duplicateRate, Seed: b.o.seed}.Messages()
	b.logf("pre-filling %d messages (%d orders)", len(prefill), b.o.messages)
	if err := load.Publish(ctx, st.amqpURL, broker.Exchange, broker.RoutingKey, prefill, 0); err != nil {
		return fmt.Errorf("pre-fill: %w", err)
	}
	w, err := b.watch(ctx, st)
	if err != nil {
		return err
	}
	defer w.close()
	if n, err := w.ready(); err != nil || n != len(prefill) {
		return fmt.Errorf("pre-fill: %d messages ready, want %d (%v)", n, len(prefill), err)
	}
	if err := c.prepare(ctx, st); err != nil {
		return err
	}
	peaks := w.obs.SampleConnections(ctx, b.pg, 100*time.Millisecond)
	defer func() {
		conns, err := peaks()
		r.conns = conns
		if err != nil {
			b.logf("connection samples: %v", err)
		}
	}()

	cpuBefore, err := sampleCPU(nil, c)
	if err != nil {
		return err
	}
	started := time.Now()
	p, err := c.start(ctx, st)
	if err != nil {
		return err
	}
	var instr *proc.Instructions
	if b.perf == nil {
		if instr, err = p.CountInstructions(); err != nil {
			return err
		}
	}
	emptied, done, err := w.drained(ctx, p, b.o.messages, b.o.drainTimeout)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	if instr != nil {
		n, err := instr.Stop()
		if err != nil {
			return fmt.Errorf("count instructions: %w", err)
		}
		r.instr = float64(n) / float64(len(prefill))
	}
	cpuAfter, err := sampleCPU(p, c)
	if err != nil {
		return err
	}
	r.cpu = perMessage(cpuBefore, cpuAfter, len(prefill))
	r.drained = len(prefill)
	r.rate = float64(len(prefill)) / done.Sub(started).Seconds()
	r.ingest = float64(len(prefill)) / emptied.Sub(started).Seconds()
	b.logf("drained %d messages in %.1fs: %.0f msg/s (the queue had none ready after %.1fs: %.0f msg/s)",
		len(prefill), done.Sub(started).Seconds(), r.rate, emptied.Sub(started).Seconds(), r.ingest)
	if err := w.settled(ctx); err != nil {
		return fmt.Errorf("after the drain: %w", err)
	}
	base := r.rate
	if s, ok := c.(settler); ok {
		if base, err = s.settle(ctx, started, len(prefill), r.rate); err != nil {
			return fmt.Errorf("after the drain: %w", err)
		}
	}

	if r.paced, err = b.paced(ctx, st, w, c, p, base); err != nil {
		return fmt.Errorf("paced phase: %w", err)
	}
	if r.rss, err = p.PeakRSS(); err != nil {
		return err
	}
	if r.lat, err = c.finish(ctx, r.paced.since); err != nil {
		return fmt.Errorf("stop %s: %w", p.Name, err)
	}
	return nil
}

// publishRecorder is a configuration that wants the paced phase's messages
// with their publish times (the pipeline: publish→shipment per order).
type publishRecorder interface {
	published(msgs []load.Message)
}

// settler is a configuration whose work goes on after its consumer has
// drained the queue (the pipeline: the relay and the shipping service).
// settle waits until that work is done too, so that the paced phase
// measures the paced load and not the drain's backlog, and returns the rate
// the paced phase is a fraction of; started is the consumer's start,
// drained the messages of the drain, drainRate the consumer's drain rate.
type settler interface {
	settle(ctx context.Context, started time.Time, drained int, drainRate float64) (float64, error)
}

// pacedEnder is told when every message of the paced phase is settled.
type pacedEnder interface {
	pacedEnds() error
}

// pacedPhase is what the paced phase did.
type pacedPhase struct {
	since time.Time     // when publishing began
	rate  float64       // messages per second
	lag   time.Duration // from the last publish until every message was settled
	busy  float64       // the machine's busy share of its cores, from the first publish until settled
	cpu   float64       // the consumer process's CPU per message over the same window, µs
}

// paced publishes for the paced phase at a fraction of the drain rate (or of
// the rate the configuration's settle returned) and waits until it is
// consumed. The lag tells whether the consumer kept up: the drain
// rate was measured without a publisher on the same cores.
func (b *bench) paced(ctx context.Context, st *stage, w *watcher, c consumer, p *proc.Process, drainRate float64) (pacedPhase, error) {
	ph := pacedPhase{since: time.Now()}
	if b.o.paced == 0 {
		return ph, nil
	}
	ph.rate = math.Min(b.o.pacedFraction*drainRate, b.o.pacedMaxRate)
	orders := max(1, int(ph.rate*b.o.paced.Seconds()/(1+b.o.duplicateRate)))
	msgs := load.Batch{Run: st.run, First: b.o.messages, Count: orders, DuplicateRate: b.o.duplicateRate, Seed: b.o.seed}.Messages()
	if err := c.pacedStarts(ctx); err != nil {
		return ph, err
	}
	b.logf("paced: %d messages at %.0f msg/s", len(msgs), ph.rate)
	before, err := sampleCPU(p, c)
	if err != nil {
		return ph, err
	}
	ph.since = time.Now()
	if err := load.Publish(ctx, st.amqpURL, broker.Exchange, broker.RoutingKey, msgs, ph.rate); err != nil {
		return ph, err
	}
	published := time.Now()
	if r, ok := c.(publishRecorder); ok {
		r.published(msgs)
	}
	_, done, err := w.drained(ctx, p, b.o.messages+orders, b.o.drainTimeout)
	if err != nil {
		return ph, err
	}
	if e, ok := c.(pacedEnder); ok {
		if err := e.pacedEnds(); err != nil {
			return ph, err
		}
	}
	ph.lag = done.Sub(published)
	after, err := sampleCPU(p, c)
	if err != nil {
		return ph, err
	}
	if wall := time.Since(ph.since); wall > 0 {
		ph.busy = float64(after.machine-before.machine) / float64(wall) / float64(runtime.NumCPU())
	}
	ph.cpu = perMessage(before, after, len(msgs)).consumer
	b.logf("paced: settled %.1fs after the last publish; the machine %.0f%% busy, the consumer %.0f µs of CPU per message",
		ph.lag.Seconds(), 100*ph.busy, ph.cpu)
	return ph, w.settled(ctx)
}

// watcher judges a drain: the payments committed and the messages still in
// the queue.
type watcher struct {
	st   *stage
	ctl  broker.Ctl
	obs  *scratchdb.Observer
	conn *amqp.Connection
	ch   *amqp.Channel
}

func (b *bench) watch(ctx context.Context, st *stage) (*watcher, error) {
	obs, err := scratchdb.Observe(ctx, st.dbURL)
	if err != nil {
		return nil, err
	}
	conn, err := amqp.Dial(st.amqpURL)
	if err != nil {
		obs.Close(ctx)
		return nil, fmt.Errorf("connect to watch the queue: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		obs.Close(ctx)
		return nil, fmt.Errorf("open a channel to watch the queue: %w", err)
	}
	return &watcher{st: st, ctl: b.ctl, obs: obs, conn: conn, ch: ch}, nil
}

func (w *watcher) close() {
	w.conn.Close()
	w.obs.Close(context.Background())
}

func (w *watcher) ready() (int, error) { return broker.Ready(w.ch, broker.Queue) }

// drained polls until no message is ready in the queue and the payments table
// holds orders rows, and returns when it first saw no message ready (emptied)
// and when it first saw both (done). The cheap queue check
// comes first, so that the table is counted only near the end. Duplicates the
// consumer holds unacked at that moment are not waited for: they settle within
// milliseconds, and settled checks them afterwards.
func (w *watcher) drained(ctx context.Context, p *proc.Process, orders int, timeout time.Duration) (emptied, done time.Time, err error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	paid := 0
	for {
		ready, err := w.ready()
		if err != nil {
			return emptied, done, err
		}
		if ready == 0 {
			if emptied.IsZero() {
				emptied = time.Now()
			}
			if paid, err = w.obs.Payments(ctx); err != nil {
				return emptied, done, fmt.Errorf("count payments: %w", err)
			}
			if paid >= orders {
				return emptied, time.Now(), nil
			}
		}
		if time.Now().After(deadline) {
			return emptied, done, fmt.Errorf("timed out after %s with %d messages ready and %d of %d payments", timeout, ready, paid, orders)
		}
		select {
		case <-ctx.Done():
			return emptied, done, ctx.Err()
		case <-p.Exited():
			return emptied, done, fmt.Errorf("%w; last lines:\n%s", p.ExitError(), p.Tail(5))
		case <-tick.C:
		}
	}
}

// settled waits until the work queue has no message left, acked or not, and
// checks that nothing was dead-lettered.
func (w *watcher) settled(ctx context.Context) error {
	var ready, unacked int
	var err error
	// A deadline, not a number of tries: a try took seconds through
	// rabbitmqctl, a fraction of one through erl_call. The broker refreshes
	// a quorum queue's counts every few seconds.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		ready, unacked, err = w.ctl.Counts(ctx, w.st.vhost, broker.Queue)
		if err == nil && ready == 0 && unacked == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done(): // a stop (SIGINT, SIGTERM): no more tries
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	switch {
	case err != nil:
		return err
	case ready+unacked > 0:
		return fmt.Errorf("%d messages ready and %d unacked are left in %s", ready, unacked, broker.Queue)
	}
	return w.noDeadLetters()
}

// noDeadLetters checks that nothing was dead-lettered.
func (w *watcher) noDeadLetters() error {
	dead, err := broker.Ready(w.ch, broker.DeadLetterQueue)
	if err != nil {
		return err
	}
	if dead > 0 {
		return fmt.Errorf("%d messages were dead-lettered", dead)
	}
	return nil
}
