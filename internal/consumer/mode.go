package consumer

import (
	"context"
	"errors"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/inbox"
)

// mode is what the inline and the buffered inbox do differently. The rest of
// the runtime is theirs alike: the broker session with its connections and
// channels, the stop's one budget, the failure decision (decide), the
// batching of commits (batcher), the pauses, the settling of deliveries.
// New picks one mode; only its goroutines ever start.
type mode interface {
	// start runs what the mode keeps beside the broker sessions for the
	// runtime's whole life: its committers, under commitCtx (which outlives
	// the sessions, so that workers draining at a stop still commit),
	// counted in committers; and any processing of its own, under ctx,
	// counted in processing.
	start(ctx, commitCtx context.Context, committers, processing *sync.WaitGroup)
	// ready reports what keeps the mode from working while the broker
	// session is fine (a pause of the buffered processing).
	ready() error
	// consume takes a session's deliveries until stop is closed or the
	// channel of deliveries is gone, in goroutines counted in wg.
	consume(work context.Context, s *session, deliveries <-chan amqp.Delivery, stop <-chan struct{}, wg *sync.WaitGroup)
	// cancels reports whether a session ending for reason (nil for a
	// graceful stop) cancels its consumer first, and then deals with the
	// deliveries the broker sent before the cancel-ok (rest), instead of
	// leaving them to the channel's close.
	cancels(reason error) bool
	// rest deals with those deliveries within ctx; cancel ends both ctx and
	// the session's work, for a phase that runs out of time.
	rest(ctx context.Context, cancel context.CancelFunc, s *session, deliveries <-chan amqp.Delivery)
}

// inlineMode is the inline inbox: workers take deliveries, look each up in
// the inbox, run the handler and hand its writes to the committers, which
// claim the message and commit the writes together; the delivery is acked
// after the commit (deliver.go).
type inlineMode struct {
	r       *Runtime
	commits *committer
	lookups *lookups
}

func newInlineMode(r *Runtime, ib *inbox.Inbox) *inlineMode {
	return &inlineMode{
		r:       r,
		commits: newCommitter(ib, r.cfg.GroupCommitMax, r.cfg.GroupCommitWait, applyMargin, r.stage, r.metrics, r.cfg.Name),
		lookups: newLookups(ib),
	}
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
	m.r.returnUnstarted(ctx, s, deliveries)
}

// bufferedMode is the buffered inbox: one ingest loop per session stores the
// deliveries and acks them (ingest.go); the processor runs the handler on the
// stored messages, in order per key, broker or not (process.go).
type bufferedMode struct {
	r    *Runtime
	cfg  BufferedConfig
	proc *processor
}

func newBufferedMode(r *Runtime, cfg BufferedConfig) *bufferedMode {
	return &bufferedMode{r: r, cfg: cfg, proc: newProcessor(r, cfg)}
}

func (b *bufferedMode) start(ctx, commitCtx context.Context, committers, processing *sync.WaitGroup) {
	b.proc.finish.run(commitCtx, b.r.cfg.Committers, committers)
	processing.Go(func() { b.proc.run(ctx) })
}

func (b *bufferedMode) ready() error { return b.proc.ready() }

func (b *bufferedMode) consume(work context.Context, s *session, deliveries <-chan amqp.Delivery, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Go(func() { b.ingestLoop(work, s, deliveries, stop) })
}

// cancels only at a graceful stop, and never under a single active consumer:
// the broker would hand the queue to the next consumer at the cancel, while
// this one still stored what it had been sent, and the two would store one
// key's messages out of order. An ingest that is pausing or ending never
// cancels either: what it could not store must go back in order, with the
// channel's close, not to the tail of the queue.
func (b *bufferedMode) cancels(reason error) bool {
	return reason == nil && !b.r.cfg.Topology.SingleActive
}

// rest stores the deliveries, so that a graceful stop gives nothing back; its
// dead-letterings run under ctx, the loop's under the session's work.
func (b *bufferedMode) rest(ctx context.Context, cancel context.CancelFunc, s *session, deliveries <-chan amqp.Delivery) {
	b.ingestRest(ctx, s, deliveries)
	b.r.drain(&s.aside, cancel)
}
