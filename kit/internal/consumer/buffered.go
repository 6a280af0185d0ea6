package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	amqp "github.com/rabbitmq/amqp091-go"
)

// BufferedConfig switches a runtime to the buffered inbox: each delivery is
// stored (buffered.Store.Ingest) in a short transaction and acked at once,
// and processing workers claim the stored messages, one per ordering key at
// a time, run the handler with no transaction open, and commit its writes
// with the message's status. The handler contract is the same as inline.
type BufferedConfig struct {
	Store *buffered.Store
	// OrderingKey names a message's ordering key from its body: messages of
	// one key are processed one at a time, in the order they were stored.
	// Nil, or "" for a body, makes the message a key of its own.
	OrderingKey func(body []byte) string
	// RetryDelays and MaxAttempts are the processing retries: the delay
	// before run n+1 after run n failed (the last repeating), and the runs
	// of one message, the first included, before it is parked. They cost the
	// broker nothing, so they can span a long outage of a dependency.
	RetryDelays []time.Duration
	MaxAttempts int
	// PollInterval is the floor of the wake-ups: besides the signal of this
	// replica's ingest and the NOTIFY of the others', workers look for due
	// messages at least this often.
	PollInterval time.Duration
	// ListenURL is the database the LISTEN connection dials (the service's
	// DATABASE_URL); "" relies on the local signal and the poll alone.
	ListenURL string
	// Lease is how long a claim holds its key before another worker may take
	// it over (its holder is presumed dead). Zero means the handler timeout
	// plus leaseMargin.
	Lease time.Duration
}

// leaseMargin is the time a lease gives beyond the handler's timeout for the
// final commit to begin. A lease that runs out is safe, only wasteful: the
// late commit finds the token changed and commits nothing.
const leaseMargin = 5 * time.Second

// BufferedDefaults returns the values a BufferedConfig's zero fields take
// (its Lease derives from the handler timeout): the one place they are
// written; BUFFER_RETRY_DELAYS, BUFFER_MAX_ATTEMPTS and BUFFER_POLL_INTERVAL
// default to them.
func BufferedDefaults() BufferedConfig {
	return BufferedConfig{
		RetryDelays:  []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute},
		MaxAttempts:  20,
		PollInterval: 5 * time.Second,
	}
}

func (c *BufferedConfig) setDefaults(handlerTimeout time.Duration) {
	d := BufferedDefaults()
	if len(c.RetryDelays) == 0 {
		c.RetryDelays = d.RetryDelays
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, d.MaxAttempts)
	c.PollInterval = cmp.Or(c.PollInterval, d.PollInterval)
	if c.Lease == 0 {
		if handlerTimeout <= 0 {
			handlerTimeout = time.Minute
		}
		c.Lease = handlerTimeout + leaseMargin
	}
}

func (c *BufferedConfig) validate() error {
	switch {
	case c.Store == nil:
		return errors.New("buffered mode without a store")
	case c.MaxAttempts < 1:
		return fmt.Errorf("buffered max attempts %d < 1", c.MaxAttempts)
	case c.PollInterval < 10*time.Millisecond:
		return fmt.Errorf("buffered poll interval %s < 10ms", c.PollInterval)
	case c.Lease < time.Second:
		return fmt.Errorf("buffered lease %s < 1s", c.Lease)
	}
	return nil
}

// bufferedMode is the buffered inbox: one ingest loop per session stores the
// deliveries and acks them (buffered_ingest.go); the processor runs the handler on the
// stored messages, in order per key, broker or not (buffered_process.go).
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
