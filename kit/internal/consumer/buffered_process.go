package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// processor runs the handler on the stored messages of the buffered mode. A
// claimer leases due messages (a key's head each) as workers become free and
// hands the messages to the workers; each runs the handler with no
// transaction open and hands its writes to the finishers, which commit them
// with the message's status (group commit). It works from the table alone,
// so it goes on while the broker is away.
type processor struct {
	rt     *Runtime
	cfg    BufferedConfig
	finish *finisher
	wake   chan struct{} // this replica stored messages, or a NOTIFY came
	notify chan struct{} // tell the other replicas
	// pauseReq is set by a worker that finds the infrastructure at fault;
	// pausedFor names a pause in progress (nil when none), for readiness.
	pauseReq  atomic.Pointer[Cause]
	pausedFor atomic.Pointer[Cause]
	// unreleased holds the releases the database refused (it was down):
	// retried when a pause ends, before claiming again.
	unreleasedMu sync.Mutex
	unreleased   []release
	log          *slog.Logger
}

// release is a claimed message to give back without spending its attempt.
type release struct {
	claimed buffered.Claimed
	cause   string // the error that made it give the message back
	counts  bool   // the release counts against MaxHolds (a pause the handler asked for)
}

// claimBatch bounds the keys one claim leases.
const claimBatch = 64

// gaugeInterval is how often the status gauges are read from the table.
const gaugeInterval = 10 * time.Second

func newProcessor(r *Runtime, cfg BufferedConfig) *processor {
	return &processor{
		rt: r, cfg: cfg,
		finish: newFinisher(cfg.Store, r.cfg.GroupCommitMax, r.cfg.GroupCommitWait, applyMargin, r.metrics, r.cfg.Name),
		wake:   make(chan struct{}, 1),
		notify: make(chan struct{}, 1),
		log:    r.log.With("component", "processor"),
	}
}

// ingested wakes this replica's claimer and, through NOTIFY, the others'.
func (p *processor) ingested() {
	poke(p.wake)
	poke(p.notify)
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// ready reports a pause in progress.
func (p *processor) ready() error {
	if cause := p.pausedFor.Load(); cause != nil {
		return fmt.Errorf("processing paused: %s is failing every message; resuming by itself", *cause)
	}
	return nil
}

// run processes until ctx ends, then stops claiming and lets the messages in
// flight finish within ShutdownTimeout; a handler still running then is
// cancelled and its message released for another replica.
func (p *processor) run(ctx context.Context) {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	jobs := make(chan buffered.Claimed)
	free := make(chan struct{}, p.rt.cfg.Workers)
	var workers sync.WaitGroup
	for range p.rt.cfg.Workers {
		free <- struct{}{}
		workers.Go(func() {
			for c := range jobs {
				p.process(work, c)
				free <- struct{}{}
			}
		})
	}
	var helpers sync.WaitGroup
	helpers.Go(func() { p.listen(ctx) })
	helpers.Go(func() { p.notifyOthers(ctx) })
	helpers.Go(func() { p.refreshGauges(ctx) })
	p.log.Info("processing stored messages", "workers", p.rt.cfg.Workers, "lease", p.cfg.Lease.String(),
		"max_attempts", p.cfg.MaxAttempts, "poll", p.cfg.PollInterval.String())
	p.claimLoop(ctx, jobs, free)
	close(jobs)
	p.rt.drain(&workers, cancelWork)
	helpers.Wait()
}

// claimLoop claims as many due messages as workers are free, and waits for
// work when there is none.
func (p *processor) claimLoop(ctx context.Context, jobs chan<- buffered.Claimed, free chan struct{}) {
	backoff := amqpsession.NewBackoff(time.Second, p.rt.cfg.ReconnectMaxWait)
	lastPause := time.Time{}
	skipped := 0 // claims in a row that found due messages they could not take
	for {
		if cause := p.pauseReq.Swap(nil); cause != nil {
			if time.Since(lastPause) > time.Minute {
				backoff.Reset()
			}
			if !p.pause(ctx, *cause, backoff) {
				return
			}
			lastPause = time.Now()
		}
		n, ok := p.takeFree(ctx, free)
		if !ok {
			return
		}
		claimed, err := p.claim(ctx, n)
		for range n - len(claimed) {
			free <- struct{}{}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.claimFailed(ctx, err)
			continue
		}
		for _, c := range claimed {
			jobs <- c
		}
		if len(claimed) == n {
			skipped = 0
			continue // more may be due
		}
		if len(claimed) > 0 {
			skipped = 0
		}
		var more bool
		if skipped, more = p.waitForWork(ctx, skipped); !more {
			return
		}
	}
}

// takeFree waits for a free worker, then takes the others free within the
// group commit wait, up to claimBatch, so that one claim serves several.
func (p *processor) takeFree(ctx context.Context, free chan struct{}) (int, bool) {
	select {
	case <-free:
	case <-ctx.Done():
		return 0, false
	}
	n := 1
	timer := time.NewTimer(p.rt.cfg.GroupCommitWait)
	defer timer.Stop()
	for n < claimBatch {
		select {
		case <-free:
			n++
			continue
		default:
		}
		select {
		case <-free:
			n++
		case <-timer.C:
			return n, true
		}
	}
	return n, true
}

func (p *processor) claim(ctx context.Context, n int) ([]buffered.Claimed, error) {
	ctx, cancel := context.WithTimeout(ctx, applyMargin)
	defer cancel()
	began := time.Now()
	claimed, err := p.cfg.Store.Claim(ctx, n, p.cfg.Lease)
	p.rt.metrics.claimSeconds.WithLabelValues(p.rt.cfg.Name).Observe(time.Since(began).Seconds())
	return claimed, err
}

// claimFailed pauses for the database's own trouble; anything else is logged
// and the claim tried again after a poll interval.
func (p *processor) claimFailed(ctx context.Context, err error) {
	if cause := p.rt.judge.infrastructure(ctx, failedAt(stepLookup, err)); !cause.isZero() {
		p.requestPause(cause)
		return
	}
	p.log.Error("claiming stored messages failed; trying again", "err", err)
	sleep(ctx, p.cfg.PollInterval)
}

// waitForWork sleeps until this replica stores messages, a NOTIFY comes, the
// next retry or lease is due, or the poll interval passes. skipped counts the
// claims in a row that left due messages behind; it returns the new count.
func (p *processor) waitForWork(ctx context.Context, skipped int) (int, bool) {
	wait := p.cfg.PollInterval
	dctx, cancel := context.WithTimeout(ctx, applyMargin)
	at, ok, err := p.cfg.Store.NextDue(dctx)
	cancel()
	switch {
	case err != nil || !ok:
		skipped = 0
	case time.Until(at) > 0:
		skipped = 0
		wait = min(wait, time.Until(at))
	default:
		// Messages that are due but were skipped: locked by another
		// claim or a settlement in progress (gone in milliseconds), or by
		// an operator's transaction (gone in minutes). Try again shortly, then less and less often,
		// down to once a second (a retry of another message that
		// falls due meanwhile waits that long at most), instead of claiming
		// in a loop; a wake-up still comes at once.
		wait = min(wait, time.Second, skippedRetry<<min(skipped, 16))
		skipped++
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.wake:
	case <-t.C:
	case <-ctx.Done():
		return skipped, false
	}
	return skipped, true
}

// skippedRetry is the first wait before claiming again a key that was due
// but locked; it doubles with every claim in a row that skips one.
const skippedRetry = 10 * time.Millisecond

func (p *processor) requestPause(cause Cause) {
	p.pauseReq.Store(&cause)
	poke(p.wake)
}

// pause stops claiming for a growing backoff, and for the database until its
// check passes; workers in flight finish meanwhile.
func (p *processor) pause(ctx context.Context, cause Cause, b *amqpsession.Backoff) bool {
	r := p.rt
	r.metrics.pauses.WithLabelValues(r.cfg.Name, cause.String()).Inc()
	p.pausedFor.Store(&cause)
	defer p.pausedFor.Store(nil)
	wait := b.Next()
	p.log.Error("processing paused: not the messages' fault; their attempts are given back",
		"cause", cause, "wait", wait.String())
	if err := r.waitToResume(ctx, cause, wait, b); err != nil {
		return false
	}
	p.releaseHeld()
	p.pauseReq.Store(nil) // the workers that failed meanwhile asked for the same pause
	p.log.Info("processing resumes", "cause", cause)
	return true
}

// process runs one claimed message to its end: processed, failed with a
// retry time, parked, or released (not its fault).
func (p *processor) process(ctx context.Context, c buffered.Claimed) {
	r := p.rt
	done := r.track()
	defer done()
	ctx, span := r.cfg.Tracer.ProcessStored(ctx, c.Headers, c.MessageID, r.cfg.Topology.Queue, r.cfg.Name, len(c.Body))
	defer span.End()
	msg := Message{ID: c.MessageID, Body: c.Body, ContentType: c.ContentType, Headers: c.Headers,
		Attempt: c.Attempts, PublishedAt: c.PublishedAt, holds: c.Holds}
	// Where it was published, stored with its headers at ingest; none for a
	// message stored without it (by v0.3.0, or of an origin unknown), which
	// Routed takes to the service's first event.
	msg.Exchange, msg.RoutingKey, _ = rabbit.HeaderOrigin(c.Headers)
	log := &messageLog{door: &r.door, msg: &msg, attrs: []any{"ordering_key", c.OrderingKey, "seq", c.Seq}}
	st := bufferedSettler{p: p, c: c, log: log, span: span}
	if c.Attempts > p.cfg.MaxAttempts {
		// Claimed that often without settling: the handler crashed the process
		// or outlived its lease every time (a crash loop).
		st.end(reasonRetriesExhausted, fmt.Errorf("claimed %d times without settling", c.Attempts))
		return
	}
	// A stored message may have called out if it ran before in this table,
	// or was marked wire.HeaderMayHaveRun when stored; its age counts from
	// its publish time, else from its ingest.
	since, what := c.PublishedAt, "published"
	if since.IsZero() {
		since, what = c.ReceivedAt, "stored"
	}
	if err := keyExpired(r.cfg.KeyTTL, since, what, c.Runs > 1 || wire.MarkedAsRun(c.Headers)); err != nil {
		st.end(reasonKeyExpired, err)
		return
	}
	if r.cfg.Decoder != nil {
		// Decoded at ingest already: this decode fails only if the
		// Decoder changed since (a new release), and then it always will.
		ev, err := r.door.decode(origin{msg.Exchange, msg.RoutingKey}, msg.Body, msg.ID)
		if err != nil {
			st.end(permanentReason(err), err)
			return
		}
		msg.Event = ev.event
	}
	r.stage(StageClaim)
	out, err := p.apply(ctx, msg, c)
	switch {
	case err == nil:
		span.Outcome(string(out), c.Attempts)
		r.stage(StageProcessCommit)
		if !msg.PublishedAt.IsZero() {
			r.metrics.endToEnd.WithLabelValues(r.cfg.Name).Observe(time.Since(msg.PublishedAt).Seconds())
		}
		r.counted(msg, out, log)
		p.signalNext()
		return
	case errors.Is(err, errLeaseLost):
		span.Outcome("lease_lost", c.Attempts)
		log.get().Warn("the lease passed to another worker before the commit; nothing committed", "attempt", c.Attempts)
		return
	}
	v := decide(r.judge.failure(ctx, err, c.MessageID, c.Attempts, p.cfg.MaxAttempts, c.Holds))
	r.carryOut(v, st, err, span, log, c.Attempts, c.Holds)
}

// signalNext wakes the claimer: the key just settled may have more messages.
func (p *processor) signalNext() { poke(p.wake) }

var errLeaseLost = errors.New("lease lost")

func (p *processor) apply(ctx context.Context, msg Message, c buffered.Claimed) (Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, p.rt.applyTimeout)
	defer cancel()
	writes, err := p.rt.handler.Handle(ctx, msg)
	if err != nil {
		return "", failedAt(stepHandler, err)
	}
	p.rt.judge.failures.succeeded() // the outside calls work
	res, err := p.finish.complete(ctx, c.Lease, writes)
	switch {
	case err != nil:
		return "", failedAt(stepCommit, err)
	case res.Lost:
		return "", errLeaseLost
	case res.Err != nil:
		return "", failedAt(stepCommit, res.Err)
	case res.Outcome == "":
		return OutcomeProcessed, nil
	}
	return Outcome(res.Outcome), nil
}

// failed records a failed run that spent its attempt, with the next run's time.
func (p *processor) failed(c buffered.Claimed, err error, log *messageLog) {
	r := p.rt
	delay := retryDelay(p.cfg.RetryDelays, c.Attempts)
	delay = time.Duration(float64(delay) * (1 - retryJitter*rand.Float64()))
	sctx, cancel := r.settleContext()
	defer cancel()
	ok, ferr := p.cfg.Store.Fail(sctx, c.Lease, delay, err.Error())
	switch {
	case ferr != nil:
		log.get().Error("could not record the failure; the lease will expire and the message run again", "err", ferr, "cause", err)
	case !ok:
		log.get().Warn("the lease passed to another worker; its failure is not recorded", "err", err)
	default:
		r.metrics.messages.WithLabelValues(r.cfg.Name, string(OutcomeRetried)).Inc()
		log.get().Warn("message failed; retry scheduled", "attempt", c.Attempts, "max_attempts", p.cfg.MaxAttempts,
			"delay", delay.Round(time.Millisecond).String(), "err", err)
	}
}

// park blocks the message's key until an operator retries, skips or exports it.
func (p *processor) park(c buffered.Claimed, reason Reason, cause error, log *messageLog) {
	r := p.rt
	sctx, cancel := r.settleContext()
	defer cancel()
	ok, err := p.cfg.Store.Park(sctx, c.Lease, reason.String(), cause.Error())
	switch {
	case err != nil:
		log.get().Error("could not park the message; the lease will expire and it is run again", "err", err, "cause", cause)
	case !ok:
		log.get().Warn("the lease passed to another worker; the message is not parked", "reason", reason)
	default:
		r.metrics.messages.WithLabelValues(r.cfg.Name, string(OutcomeParked)).Inc()
		r.metrics.parked.WithLabelValues(r.cfg.Name, reason.String()).Inc()
		log.get().Error("message parked: its key waits for an operator (inboxctl inbox retry, skip or export)",
			"reason", reason, "attempt", c.Attempts, "err", cause)
	}
}

// release gives the message back without spending its attempt; counts adds
// one to its holds (a pause the handler asked for, bounded by MaxHolds). If
// the database refuses (it is down: the likeliest reason to release), the
// release is kept and tried again when the pause ends, before this replica
// claims anything: unless another replica has taken the message over after
// its lease ended, its attempt is given back then.
func (p *processor) release(c buffered.Claimed, cause error, counts bool, log *messageLog) {
	u := release{claimed: c, cause: cause.Error(), counts: counts}
	if !p.releaseOne(u, log) {
		p.unreleasedMu.Lock()
		p.unreleased = append(p.unreleased, u)
		p.unreleasedMu.Unlock()
	}
}

// releaseOne releases u, and reports false if the database refused.
func (p *processor) releaseOne(u release, log *messageLog) bool {
	sctx, cancel := p.rt.settleContext()
	defer cancel()
	ok, err := p.cfg.Store.Release(sctx, u.claimed.Lease, p.cfg.RetryDelays[0], u.cause, u.counts)
	switch {
	case err != nil:
		if _, stopping := p.rt.stopLeft(); stopping {
			log.get().Warn("could not release the message within the stop's budget; its lease ends by itself", "err", err)
			return true
		}
		log.get().Warn("could not release the message; trying again when the pause ends", "err", err)
		return false
	case ok:
		p.rt.metrics.messages.WithLabelValues(p.rt.cfg.Name, string(OutcomeRequeued)).Inc()
	}
	return true
}

// releaseHeld retries the releases the database refused. One it refuses
// again stays for the next pause; its lease ends meanwhile either way.
func (p *processor) releaseHeld() {
	p.unreleasedMu.Lock()
	held := p.unreleased
	p.unreleased = nil
	p.unreleasedMu.Unlock()
	var again []release
	for _, u := range held {
		msg := Message{ID: u.claimed.MessageID}
		log := &messageLog{door: &p.rt.door, msg: &msg, attrs: []any{"ordering_key", u.claimed.OrderingKey, "seq", u.claimed.Seq}}
		if !p.releaseOne(u, log) {
			again = append(again, u)
		}
	}
	if len(again) > 0 {
		p.unreleasedMu.Lock()
		p.unreleased = append(p.unreleased, again...)
		p.unreleasedMu.Unlock()
	}
}

// refreshGauges reads the status counts, the lag and the blocked keys from
// the table every gaugeInterval.
func (p *processor) refreshGauges(ctx context.Context) {
	t := time.NewTicker(gaugeInterval)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, gaugeInterval)
		st, err := p.cfg.Store.Stats(qctx, false)
		cancel()
		if err == nil {
			p.rt.metrics.setBuffered(p.rt.cfg.Name, st)
		} else if ctx.Err() == nil {
			p.log.Debug("could not read the buffer's gauges", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
