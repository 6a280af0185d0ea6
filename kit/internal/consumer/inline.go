package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// inlineMode is the inline inbox: workers take deliveries, look each up in
// the inbox, run the handler and hand its writes to the committers, which
// claim the message and commit the writes together; the delivery is acked
// after the commit (inline_commit.go).
type inlineMode struct {
	r       *Runtime
	commits *committer
	lookups *lookups
}

func newInlineMode(r *Runtime, ib *inbox.Inbox) *inlineMode {
	m := &inlineMode{
		r:       r,
		commits: newCommitter(ib, r.cfg.GroupCommitMax, r.cfg.GroupCommitWait, applyMargin, r.stage, r.metrics, r.cfg.Name),
		lookups: newLookups(ib),
	}
	m.commits.tracer, m.commits.queue = r.cfg.Tracer, r.cfg.Topology.Queue
	return m
}
func (m *inlineMode) start(_, commitCtx context.Context, committers, _ *sync.WaitGroup) {
	m.commits.run(commitCtx, m.r.cfg.Committers, committers)
	m.lookups.run(commitCtx, LookupReaders, committers)
}
func (m *inlineMode) ready() error { return nil }
func (m *inlineMode) consume(work context.Context, s *session, deliveries <-chan amqp.Delivery, stop <-chan struct{}, wg *sync.WaitGroup) {
	for range m.r.cfg.Workers {
		wg.Go(func() { m.work(work, s, deliveries, stop) })
	}
}

// cancels: at a graceful stop, a pause, or a redeclare, the deliveries sent
// before the cancel-ok are republished to the work queue (returnUnstarted):
// a return by the channel's close would count against the quorum queue's
// delivery limit.
func (m *inlineMode) cancels(reason error) bool {
	return reason == nil || errors.Is(reason, errRedeclare) || errors.As(reason, new(errPausedSession))
}
func (m *inlineMode) rest(ctx context.Context, _ context.CancelFunc, s *session, deliveries <-chan amqp.Delivery) {
	m.r.mover.returnUnstarted(ctx, s, deliveries)
}

// deliver runs one delivery to its end: it is acked, sent to a retry queue or
// the dead-letter exchange (then acked), or requeued; or, if its channel died
// meanwhile, left for the broker to redeliver.
func (m *inlineMode) deliver(ctx context.Context, s *session, d amqp.Delivery) {
	r := m.r
	ctx, span := r.cfg.Tracer.Process(ctx, d, r.cfg.Topology.Queue, r.cfg.Name)
	defer span.End()
	msg := r.door.received(d)
	reason, admitErr := r.door.admit(d, &msg)
	if reason.isZero() && msg.undecoded != nil {
		reason, admitErr = permanentReason(msg.undecoded), msg.undecoded
	}
	log := &messageLog{door: &r.door, msg: &msg, tag: d.DeliveryTag, redelivered: d.Redelivered}
	if !reason.isZero() {
		span.Outcome(string(OutcomeDeadLettered), msg.Attempt)
		span.FailAs(admitErr, reason.String())
		r.mover.deadLetter(ctx, s, d, msg, reason, admitErr, log)
		return
	}
	out, ack, err := m.apply(ctx, s, d.DeliveryTag, &msg, span)
	switch {
	case err == nil && ack.sent:
		span.Outcome(string(out), msg.Attempt)
		r.acked(msg, out, log, ack.err) // by its committer, with its batch
		return
	case err == nil:
		span.Outcome(string(out), msg.Attempt)
		r.stage(StageCommit)
		r.ack(ctx, s, d, msg, out, log)
		return
	}
	v := decide(r.judge.failure(ctx, err, msg.ID, msg.Attempt, r.cfg.MaxAttempts, msg.holds))
	r.carryOut(v, inlineSettler{r: r, ctx: ctx, s: s, d: d, msg: msg, log: log, span: span}, err, span, log, msg.Attempt, msg.holds)
}

// apply looks the message up in the inbox (after any worker of this replica
// holding the same id is done), runs the handler with no transaction open,
// then hands its writes to the committers and waits for their commit. The
// committer acks what it committed, with the rest of its batch (ack.sent);
// a duplicate found by the look-up is left to the caller to ack.
func (m *inlineMode) apply(ctx context.Context, s *session, tag uint64, msg *Message, span tracing.Span) (Outcome, sentAck, error) {
	r := m.r
	ctx, cancel := context.WithTimeout(ctx, r.applyTimeout)
	defer cancel()
	release, err := r.inFlight.acquire(ctx, msg.ID)
	if err != nil {
		return "", sentAck{}, err
	}
	defer release()
	seen, err := m.lookups.seen(ctx, msg.ID, msg.Body)
	switch {
	case err != nil:
		return "", sentAck{}, failedAt(stepLookup, err)
	case seen:
		return OutcomeDuplicate, sentAck{}, nil
	}
	// A retry, a redelivery, one put back, or a copy marked
	// wire.HeaderMayHaveRun may have called out before.
	if err := keyExpired(r.cfg.KeyTTL, msg.PublishedAt, "published", msg.MayHaveRun()); err != nil {
		return "", sentAck{}, err
	}
	msg.ran = true
	writes, err := r.handler.Handle(ctx, *msg)
	if err != nil {
		return "", sentAck{}, failedAt(stepHandler, err)
	}
	r.judge.failures.succeeded() // the outside calls work
	out, fresh, ack, err := m.commits.commit(ctx, *msg, writes, s.acks, tag, span)
	switch {
	case err != nil:
		return "", sentAck{}, failedAt(stepCommit, err)
	case !fresh:
		return OutcomeDuplicate, ack, nil
	case out == "":
		out = OutcomeProcessed
	}
	if !msg.PublishedAt.IsZero() {
		r.metrics.endToEnd.WithLabelValues(r.cfg.Name).Observe(time.Since(msg.PublishedAt).Seconds())
	}
	return out, ack, nil
}
