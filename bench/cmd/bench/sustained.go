package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/broker"
	"github.com/inbox-template/payment-service/bench/internal/load"
	"github.com/inbox-template/payment-service/bench/internal/proc"
	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

// sustainedQueueLength bounds the OrderPaid queue of the sustained run, which
// no one consumes: the broker keeps the newest events and drops the oldest,
// so that its memory stays bounded however long the run.
const sustainedQueueLength = 20000

// backlogMargin is how much larger than the estimated need the sustained
// run's backlog is: the service may drain faster than its probe did (the
// probe's rate includes its start).
const backlogMargin = 1.5

// prefillChunk bounds the orders the bench holds in memory at once while it
// pre-fills the sustained run's backlog.
const prefillChunk = 50000

// runSustained measures payment-service with group commit and its relay,
// the gateway at 0 ms, at its full rate for -sustain: whether the relay keeps
// up with the payments when they commit as fast as they can for minutes,
// seen in the outbox's oldest pending age every second.
//
// The service is kept at its full rate by a backlog of OrderPlaced published
// before its start, not by a publisher topping the queue up while it runs:
// such a publisher would take CPU on the same two cores (its own, and the
// broker's for every enqueue and confirm) during the window measured, and
// lower the rate the run is meant to be at. A pre-filled queue leaves the
// broker only the deliveries to do, as in the drains of the other
// configurations. Its size comes from a short probe, the drain of -messages
// orders by the same service (or from -sustain-rate); a backlog that runs out
// before the end is reported, not hidden.
func (b *bench) runSustained(ctx context.Context) (r result) {
	s := b.newService(true, false)
	r = result{
		name:     "sustained",
		label:    fmt.Sprintf("sustained: payment-service (group commit, gateway 0 ms) and its relay at full rate for %s", b.o.sustain),
		settings: s.settings(),
		unit:     "payments",
	}
	st, cleanup, err := b.newStage(ctx, "sustained", func(url string) error {
		if err := broker.DeclareWork(url); err != nil {
			return err
		}
		return broker.DeclareEvents(url, sustainedQueueLength)
	})
	if err != nil {
		r.err = err
		return r
	}
	defer cleanup()
	defer s.stop()
	r.err = b.sustain(ctx, st, s, &r)
	return r
}

func (b *bench) sustain(ctx context.Context, st *stage, s *service, r *result) error {
	w, err := b.watch(ctx, st)
	if err != nil {
		return err
	}
	defer w.close()
	if err := s.prepare(ctx, st); err != nil {
		return err
	}
	probe, err := b.probe(ctx, st, w, s)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	backlog, err := b.prefillBacklog(ctx, st, w, probe)
	if err != nil {
		return err
	}
	run, err := b.sustainedRun(ctx, st, w, s, r)
	if err != nil {
		return err
	}
	if err := w.noDeadLetters(); err != nil {
		return err
	}
	r.note = run.summary(b.o.sustain, probe, b.o.sustainRate, backlog)
	return nil
}

// probe drains -messages orders with the service as the run will start it,
// waits until the outbox is empty, stops the service, and returns its drain
// rate in messages per second.
func (b *bench) probe(ctx context.Context, st *stage, w *watcher, s *service) (float64, error) {
	msgs := load.Batch{Run: st.run, Count: b.o.messages, DuplicateRate: b.o.duplicateRate, Seed: b.o.seed}.Messages()
	b.logf("probe: %d messages (%d orders)", len(msgs), b.o.messages)
	if err := load.Publish(ctx, st.amqpURL, broker.Exchange, broker.RoutingKey, msgs, 0); err != nil {
		return 0, err
	}
	started := time.Now()
	p, err := s.start(ctx, st)
	if err != nil {
		return 0, err
	}
	_, done, err := w.drained(ctx, p, b.o.messages, b.o.drainTimeout)
	if err != nil {
		return 0, err
	}
	rate := float64(len(msgs)) / done.Sub(started).Seconds()
	if _, err := waitOutboxDrained(ctx, w.obs, p, b.o.drainTimeout); err != nil {
		return 0, err
	}
	b.logf("probe: %.0f msg/s", rate)
	return rate, p.Stop(ctx, 30*time.Second)
}

// prefillBacklog publishes enough orders to keep the service at its full
// rate for -sustain, and returns how many messages it published.
func (b *bench) prefillBacklog(ctx context.Context, st *stage, w *watcher, probe float64) (int, error) {
	rate := b.o.sustainRate
	if rate == 0 {
		rate = probe
	}
	orders := int(math.Ceil(backlogMargin * rate * b.o.sustain.Seconds() / (1 + b.o.duplicateRate)))
	b.logf("pre-filling a backlog of %d orders: %s at %.0f msg/s, and half as much again", orders, b.o.sustain, rate)
	published := 0
	for first := b.o.messages; first < b.o.messages+orders; first += prefillChunk {
		msgs := load.Batch{Run: st.run, First: first, Count: min(prefillChunk, b.o.messages+orders-first),
			DuplicateRate: b.o.duplicateRate, Seed: b.o.seed}.Messages()
		if err := load.Publish(ctx, st.amqpURL, broker.Exchange, broker.RoutingKey, msgs, 0); err != nil {
			return published, fmt.Errorf("pre-fill: %w", err)
		}
		published += len(msgs)
	}
	if n, err := w.ready(); err != nil || n != published {
		return published, fmt.Errorf("pre-fill: %d messages ready, want %d (%v)", n, published, err)
	}
	return published, nil
}

// sustainedRun is what the run measured.
type sustainedRun struct {
	elapsed        time.Duration
	payments, sent int // over the run
	ages           []scratchdb.OutboxSample
	dryAfter       time.Duration // when the backlog was first seen empty; 0 if never
}

// sustainedRun starts the service on the backlog and samples the outbox
// every second for -sustain; the counts and the CPU are taken at both ends.
func (b *bench) sustainedRun(ctx context.Context, st *stage, w *watcher, s *service, r *result) (sustainedRun, error) {
	var run sustainedRun
	payments0, err := w.obs.Payments(ctx)
	if err != nil {
		return run, err
	}
	out0, err := w.obs.OutboxCounts(ctx)
	if err != nil {
		return run, err
	}
	peaks := w.obs.SampleConnections(ctx, b.pg, 100*time.Millisecond)
	defer func() { r.conns, _ = peaks() }()
	before, err := sampleCPU(nil, s)
	if err != nil {
		return run, err
	}
	b.logf("sustained: %s at full rate", b.o.sustain)
	started := time.Now()
	p, err := s.start(ctx, st)
	if err != nil {
		return run, err
	}
	if err := b.sampleSustained(ctx, w, p, started, &run); err != nil {
		return run, err
	}
	after, err := sampleCPU(p, s)
	if err != nil {
		return run, err
	}
	run.elapsed = time.Since(started)
	// Each count's snapshot is taken as it starts: the moment the run ends.
	payments1, err := w.obs.Payments(ctx)
	if err != nil {
		return run, err
	}
	out1, err := w.obs.OutboxCounts(ctx)
	if err != nil {
		return run, err
	}
	run.payments, run.sent = payments1-payments0, out1.Sent-out0.Sent
	if out1.Parked > 0 {
		return run, fmt.Errorf("%d outbox rows parked", out1.Parked)
	}
	if r.rss, err = p.PeakRSS(); err != nil {
		return run, err
	}
	if err := p.Stop(ctx, 30*time.Second); err != nil {
		return run, err
	}
	r.rate = float64(run.payments) / run.elapsed.Seconds()
	r.cpu = perMessage(before, after, max(run.payments, 1))
	b.logf("sustained: %.0f payments/s, %.0f events sent/s", r.rate, float64(run.sent)/run.elapsed.Seconds())
	return run, nil
}

// sampleSustained reads the outbox and the work queue every second until
// -sustain has passed since started.
func (b *bench) sampleSustained(ctx context.Context, w *watcher, p *proc.Process, started time.Time, run *sustainedRun) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	end := time.NewTimer(time.Until(started.Add(b.o.sustain)))
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.Exited():
			return fmt.Errorf("%w; last lines:\n%s", p.ExitError(), p.Tail(5))
		case <-end.C:
			return nil
		case <-tick.C:
		}
		a, err := w.obs.Outbox(ctx)
		if err != nil {
			return err
		}
		run.ages = append(run.ages, a)
		ready, err := w.ready()
		if err != nil {
			return err
		}
		if ready == 0 && run.dryAfter == 0 {
			run.dryAfter = time.Since(started)
			b.logf("sustained: the backlog ran out after %.0fs", run.dryAfter.Seconds())
		}
	}
}

// summary renders the run for the table's note.
func (run sustainedRun) summary(length time.Duration, probe, sustainRate float64, backlog int) string {
	sized := fmt.Sprintf("the probe's drain rate, %.0f msg/s", probe)
	if sustainRate > 0 {
		sized = fmt.Sprintf("-sustain-rate %.0f msg/s", sustainRate)
	}
	out := fmt.Sprintf("%s at full rate on a backlog of %d messages (%s, and half as much again) after a probe: "+
		"%.0f payments committed per second (the rate column), the relay marked %.0f events sent per second",
		length, backlog, sized, float64(run.payments)/run.elapsed.Seconds(), float64(run.sent)/run.elapsed.Seconds())
	if len(run.ages) > 0 {
		ages := make([]float64, len(run.ages))
		maxPending := 0
		for i, a := range run.ages {
			ages[i] = ms(a.Oldest)
			maxPending = max(maxPending, a.Pending)
		}
		slices.Sort(ages)
		peak := ages[len(ages)-1]
		under := "stayed under 1 s"
		if peak >= 1000 {
			under = "did not stay under 1 s"
		}
		out += fmt.Sprintf("; the outbox's oldest pending age, every second (%d samples): max %.0f ms, p99 %.0f ms: it %s; pending rows at most %d",
			len(ages), peak, quantile(ages, 0.99), under, maxPending)
	}
	if run.dryAfter > 0 {
		out += fmt.Sprintf("; THE BACKLOG RAN OUT after %.0f s: the rest of the run was below the full rate (raise -sustain-rate)", run.dryAfter.Seconds())
	} else {
		out += "; the backlog lasted the whole run"
	}
	return out + fmt.Sprintf("; the events go to a quorum queue no one consumes, kept to its newest %d (drop-head)", sustainedQueueLength)
}
