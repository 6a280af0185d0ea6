package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// RelayConfig tunes a Relay. Zero values are replaced by those of RelayDefaults.
type RelayConfig struct {
	AMQPURL   string
	Heartbeat time.Duration
	Name      string // the connection's name in the management UI
	// Exchanges are declared (topic, durable) at every connect: the
	// exchanges the service publishes to.
	Exchanges []string
	// Batch bounds the rows one claim leases and publishes together.
	Batch int
	// PollInterval is the floor of the wake-ups: besides its own process's
	// commits and the other replicas' NOTIFY, the relay looks this often.
	PollInterval time.Duration
	// Lease is how long a claim holds its rows before another relay may
	// take them over (their holder is presumed dead): above the publish
	// timeout, so that two relays never publish one row at the same time.
	Lease time.Duration
	// RetryDelays and MaxAttempts are a row's retries after a failed
	// publish (no queue bound, refused by the broker): the delay before
	// attempt n+1 (the last repeating), and the attempts before it is parked.
	RetryDelays []time.Duration
	MaxAttempts int
	// ListenURL is the database the LISTEN connection dials; "" relies on the
	// process's own wake-ups and the poll.
	ListenURL string
	// ReconnectMaxWait caps the backoff after the broker or the database failed.
	ReconnectMaxWait time.Duration
	// OnPublished, if set, runs after a batch is confirmed by the broker and
	// before it is marked sent: the crash point after-outbox-publish.
	OnPublished func()
	// PublishTimeout bounds the wait for a row's confirm (15s by default);
	// the lease must exceed it. Tests scale it down.
	PublishTimeout time.Duration
}

// RelayDefaults returns the values a RelayConfig's zero fields take: the one
// place they are written; OUTBOX_BATCH, OUTBOX_POLL_INTERVAL, OUTBOX_LEASE,
// OUTBOX_RETRY_DELAYS and OUTBOX_MAX_ATTEMPTS default to them.
func RelayDefaults() RelayConfig {
	return RelayConfig{
		Heartbeat:        10 * time.Second,
		Batch:            100,
		PollInterval:     time.Second,
		Lease:            30 * time.Second,
		RetryDelays:      []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute},
		MaxAttempts:      20,
		ReconnectMaxWait: 30 * time.Second,
		PublishTimeout:   defaultPublishTimeout,
	}
}

func (c *RelayConfig) setDefaults() {
	d := RelayDefaults()
	c.Heartbeat = cmp.Or(c.Heartbeat, d.Heartbeat)
	c.Batch = cmp.Or(c.Batch, d.Batch)
	c.PollInterval = cmp.Or(c.PollInterval, d.PollInterval)
	c.Lease = cmp.Or(c.Lease, d.Lease)
	if len(c.RetryDelays) == 0 {
		c.RetryDelays = d.RetryDelays
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, d.MaxAttempts)
	c.ReconnectMaxWait = cmp.Or(c.ReconnectMaxWait, d.ReconnectMaxWait)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, d.PublishTimeout)
}

// defaultPublishTimeout bounds the wait for a row's confirm; the lease must
// outlast it.
const defaultPublishTimeout = 15 * time.Second

// Park reasons.
const (
	ReasonUnroutable = "unroutable" // no queue is bound for it (a mandatory publish returned)
	ReasonRefused    = "refused"    // the broker nacked it, or closed the channel on it (404, 403, 406)
	ReasonInvalid    = "invalid"    // AMQP cannot carry it (a name over 255 bytes): parked at once
)

// claimsInFlight bounds the rows a relay holds claimed and not yet settled to
// this many claims' worth: while one claim's rows wait for their confirms and
// another's are marked sent, the next is claimed and published.
const claimsInFlight = 4

// notifyEvery throttles the relay's NOTIFY to the other replicas.
const notifyEvery = 50 * time.Millisecond

// Relay publishes one producer's committed outbox rows. Every replica runs
// one; their claims never take the same row at the same time.
type Relay struct {
	cfg     RelayConfig
	nodes   *rabbit.Nodes     // the broker's nodes (AMQP_URL)
	node    amqpsession.Nodes // the last session's node; Run's goroutine only
	store   *Store
	outbox  *Outbox
	metrics *Metrics
	log     *slog.Logger
	notify  chan struct{} // tell the other replicas
	remote  chan struct{} // another replica committed rows (NOTIFY)
	// due says that marking ordered rows sent made their successors due.
	due chan struct{}
	// state for readiness: "" while connected, else why not.
	state atomic.Pointer[string]
	// blocked follows the session's connection being blocked by the broker
	// (nil between sessions): readiness reads it when asked, so that it
	// cannot keep a block the session loop saw and missed the end of.
	blocked atomic.Pointer[amqpsession.Blocked]
}

// NewRelay returns the relay of ob's rows in store.
func NewRelay(cfg RelayConfig, store *Store, ob *Outbox, m *Metrics, log *slog.Logger) (*Relay, error) {
	cfg.setDefaults()
	switch {
	case cfg.AMQPURL == "":
		return nil, errors.New("outbox relay: AMQP URL is empty")
	case cfg.Lease <= cfg.PublishTimeout:
		return nil, fmt.Errorf("outbox relay: lease %s must exceed the publish timeout %s", cfg.Lease, cfg.PublishTimeout)
	case cfg.Batch < 1 || cfg.MaxAttempts < 1:
		return nil, fmt.Errorf("outbox relay: batch %d and max attempts %d must be at least 1", cfg.Batch, cfg.MaxAttempts)
	}
	nodes, err := rabbit.ParseNodes(cfg.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: AMQP URL: %w", err)
	}
	r := &Relay{cfg: cfg, nodes: nodes, store: store, outbox: ob, metrics: m, log: log.With("component", "outbox relay"),
		notify: make(chan struct{}, 1), remote: make(chan struct{}, 1), due: make(chan struct{}, 1)}
	r.setState("starting")
	return r, nil
}

func (r *Relay) setState(s string) { r.state.Store(&s) }

// Ready reports nil while the relay is connected to the broker and not
// blocked by it. A backlog alone never fails it.
func (r *Relay) Ready() error {
	if s := *r.state.Load(); s != "" {
		return errors.New(s)
	}
	if b := r.blocked.Load(); b != nil && b.Until() != nil {
		return errBlocked
	}
	return nil
}

// errBlocked: the broker blocks the relay's connection.
var errBlocked = errors.New("the broker blocks publishing (resource alarm)")

// Run publishes until ctx ends. A batch in flight then is given its publish
// timeout to be confirmed and marked: a row published and not marked is
// published again by the next relay, with the same id.
func (r *Relay) Run(ctx context.Context) error {
	var helpers sync.WaitGroup
	defer helpers.Wait()
	hctx, stopHelpers := context.WithCancel(ctx)
	defer stopHelpers()
	channel := database.Channel("outbox", r.store.Producer())
	if r.cfg.ListenURL != "" {
		// A NOTIFY wakes the relay without sending one in turn (its own comes
		// back to it too).
		helpers.Go(func() {
			database.Listen(hctx, r.cfg.ListenURL, r.cfg.Name+" listen", channel, func() { signal(r.remote) }, r.log)
		})
	}
	helpers.Go(func() {
		database.NotifyThrottled(hctx, r.notify, notifyEvery, func(ctx context.Context) error {
			_, err := r.store.db.ExecContext(ctx, `SELECT pg_notify($1, '')`, channel)
			return err
		}, r.log)
	})
	helpers.Go(func() { r.refreshGauges(hctx) })
	r.log.Info("relaying the outbox", "producer", r.store.Producer(), "batch", r.cfg.Batch, "poll", r.cfg.PollInterval.String())
	backoff := amqpsession.NewBackoff(amqpsession.FirstWait, r.cfg.ReconnectMaxWait)
	err := amqpsession.Loop(ctx, backoff, r.session, func(err error) error {
		if err == nil {
			err = errors.New("the session ended")
		}
		wait := backoff.Next()
		r.setState("outbox relay not connected to the broker: " + err.Error())
		r.metrics.reconnects.WithLabelValues(r.store.Producer()).Inc()
		r.log.Warn("outbox relay session ended; reconnecting (nothing is lost: unsent rows wait in the table)", "err", err, "wait", wait.String())
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		return nil
	})
	r.setState("stopped")
	return err
}

// leaseOutlasts says whether c's lease lasts for d more: a row is
// published only while its confirm can come within the lease, for past it
// another relay may take the row and publish it too (and a key's head could
// arrive after its successor). The lease is counted from before the claim,
// by this process's clock.
func (r *Relay) leaseOutlasts(c Claimed, d time.Duration) bool {
	return time.Until(c.leasedUntil) > d
}

// signal sends on a wake-up channel of room one, never blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (r *Relay) claim(ctx context.Context) ([]Claimed, int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return r.store.Claim(cctx, r.cfg.Batch, r.cfg.Lease)
}

// publishing is a row as it goes to the broker: its id as the message_id,
// persistent, with its creation as the publish time (for the next
// consumer's key-expiry guard) unless the handler set one.
func publishing(c Claimed) amqp.Publishing {
	h := c.Headers
	if h == nil {
		h = amqp.Table{}
	}
	if _, ok := h[wire.HeaderTimestampMillis]; !ok {
		h[wire.HeaderTimestampMillis] = c.CreatedAt.UnixMilli()
	}
	return amqp.Publishing{
		MessageId: c.ID, ContentType: c.ContentType, DeliveryMode: amqp.Persistent,
		Headers: h, Body: c.Body, Timestamp: c.CreatedAt,
	}
}

// refreshGauges reads the pending and parked counts and the oldest pending
// age from the table every few seconds.
func (r *Relay) refreshGauges(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := r.store.Status(qctx)
		cancel()
		if err == nil {
			r.metrics.set(r.store.Producer(), st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sleep waits d, or until ctx ends: it reports whether it waited all of d.
func sleep(ctx context.Context, d time.Duration) bool { return amqpsession.Sleep(ctx, d) }
