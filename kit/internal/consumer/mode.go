package consumer

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
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
