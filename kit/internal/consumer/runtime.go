package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// Config tunes a Runtime. Zero values are replaced by those of Defaults,
// but for Prefetch and Workers when only one is set: the other follows it
// (Workers at most Prefetch).
type Config struct {
	Name      string // consumer name: inbox column, metric label, connection name
	AMQPURL   string
	Heartbeat time.Duration
	Topology  rabbit.Topology
	Prefetch  int
	// Workers run handlers, outside calls included, with no database
	// connection held: it can be far above the pool size.
	Workers int
	// Committers run the final transactions, each on one pooled connection at
	// a time; GroupCommitMax messages at most share one transaction, waiting at
	// most GroupCommitWait for the batch to fill. GroupCommitMax 1 gives every
	// message its own transaction; 0 means 32 with a wait of 2ms.
	Committers      int
	GroupCommitMax  int
	GroupCommitWait time.Duration
	// MaxBodyBytes rejects larger bodies before they are parsed.
	MaxBodyBytes int
	// ContentTypes the handler accepts; an empty content type is taken as the first.
	ContentTypes []string
	// Decoder, if set, decodes each body once before the handler runs
	// (Events): the dedupe key of a delivery without a message_id property
	// and the buffered mode's ordering key come from the event, and the
	// handler gets it as Message.Event. A body it refuses is dead-lettered
	// at once. It replaces KeyFromBody and BufferedConfig.OrderingKey.
	Decoder Decoder
	// KeyFromBody finds the dedupe key in a body when the producer set no
	// message_id property. Nil means the message_id property is required
	// (unless the Decoder finds one).
	KeyFromBody func(body []byte) string
	// LogAttrs adds handler-specific attributes (an order id) to every log line
	// about a message. It must not fail: return nothing for a body it cannot read.
	LogAttrs func(body []byte) []slog.Attr
	// MaxAttempts counts every handler run of a message, the first included.
	MaxAttempts int
	// ShutdownTimeout bounds a graceful stop, every phase together: in-flight
	// messages finishing, the unstarted ones given back or stored, the
	// copies being published (see markStopping).
	ShutdownTimeout time.Duration
	// ReconnectMaxWait caps the jittered exponential backoff between sessions.
	ReconnectMaxWait time.Duration
	// DatabaseCheck reports whether the database answers and takes writes,
	// preferably on a connection of its own (database.Checker). The runtime
	// asks it before each session, while paused, and after a database step
	// failed with an error that says nothing by itself.
	DatabaseCheck func(ctx context.Context) error
	// PauseAfterFailures pauses consumption once this many distinct messages
	// failed in the handler in a row (retried errors of the outside-call
	// step, with no success in between): a dependency that fails every
	// message alike (a gateway down) would otherwise spend every message's
	// retry budget and dead-letter the stream. Below the bound, a message's
	// own budget is decided: one at its last attempt is dead-lettered, and
	// one message failing alone never pauses. Once the run has reached it,
	// every failure until a success is the dependency's: a message that
	// spent its attempts before is put back too. So the pause protects a stream of at least
	// this many messages; fewer, failing longer than the retries last, are
	// dead-lettered (retries_exhausted). 0 means 20; -1 never pauses.
	PauseAfterFailures int
	// MaxHolds bounds how often a pause the service's code asked for
	// (Pause, from the handler or its writes) may put one message back
	// without spending an attempt: the message that made the handler ask
	// that often is taken to be at fault itself, not the dependency, and is
	// dead-lettered (buffered: parked) with wire.ReasonHeldTooOften. The
	// runtime's own pauses (the database's trouble, handler_failing) and its
	// lock waits never count: an outage must not dead-letter good messages.
	// 0 means 20.
	MaxHolds int
	// ResetDatabase, if set, is called when a database pause ends, before
	// consuming again: the pool's sessions from the outage may keep its state
	// (read-only), and the runtime's checker saw only a fresh one.
	ResetDatabase func()
	// OnStage, if set, is called as each message passes each Stage.
	OnStage func(Stage)
	// KeyTTL is how long the services the handler calls remember an
	// idempotency key. A message that may have called out before (a retry, a
	// redelivery, one put back) and was published longer ago than this is
	// dead-lettered (wire.ReasonKeyExpired) instead of calling again with a key
	// that may be forgotten. Zero turns the guard off.
	KeyTTL time.Duration
	// StallTimeout is how long workers may hold deliveries without finishing
	// any before readiness fails: longer than any message can legitimately
	// take. Zero derives it from the handler timeout (see New).
	StallTimeout time.Duration
	// Buffered, if set, runs the buffered inbox instead of the inline one:
	// deliveries are stored and acked at once, and Workers process them from
	// the table in order per key (see BufferedConfig).
	Buffered *BufferedConfig
	// Tracer, if set, traces each delivery (nil: tracing off): a process span
	// with its outcome, the commit, the settlement and the retry or
	// dead-letter copy's publish as its children, and the handler's own
	// spans under it.
	Tracer *tracing.Tracer
}

// Defaults returns the values a Config's zero fields take: the one place the
// runtime's defaults are written. A service's environment variables default
// to them (PREFETCH, WORKERS, MAX_ATTEMPTS, …: service.Config).
func Defaults() Config {
	return Config{
		Heartbeat:          10 * time.Second,
		Topology:           rabbit.Topology{RetryDelays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}},
		Prefetch:           192,
		Workers:            128,
		Committers:         4,
		GroupCommitMax:     32,
		GroupCommitWait:    2 * time.Millisecond,
		MaxBodyBytes:       64 << 10,
		ContentTypes:       []string{"application/json"},
		MaxAttempts:        5,
		ShutdownTimeout:    20 * time.Second,
		ReconnectMaxWait:   30 * time.Second,
		PauseAfterFailures: 20,
		MaxHolds:           20,
	}
}

func (c *Config) setDefaults() {
	d := Defaults()
	switch { // one of the two set: the other follows it
	case c.Prefetch == 0 && c.Workers == 0:
		c.Prefetch, c.Workers = d.Prefetch, d.Workers
	case c.Prefetch == 0:
		c.Prefetch = max(d.Prefetch, c.Workers)
	case c.Workers == 0:
		c.Workers = min(d.Workers, c.Prefetch)
	}
	c.Committers = cmp.Or(c.Committers, d.Committers)
	if c.GroupCommitMax == 0 { // a wait of 0 is a setting of its own
		c.GroupCommitMax, c.GroupCommitWait = d.GroupCommitMax, d.GroupCommitWait
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, d.MaxBodyBytes)
	if len(c.ContentTypes) == 0 {
		c.ContentTypes = d.ContentTypes
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, d.MaxAttempts)
	if len(c.Topology.RetryDelays) == 0 {
		c.Topology.RetryDelays = d.Topology.RetryDelays
	}
	c.PauseAfterFailures = cmp.Or(c.PauseAfterFailures, d.PauseAfterFailures)
	c.MaxHolds = cmp.Or(c.MaxHolds, d.MaxHolds)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, d.ShutdownTimeout)
	c.ReconnectMaxWait = cmp.Or(c.ReconnectMaxWait, d.ReconnectMaxWait)
	c.Heartbeat = cmp.Or(c.Heartbeat, d.Heartbeat)
	if c.DatabaseCheck == nil {
		c.DatabaseCheck = func(context.Context) error { return nil }
	}
}

// setBufferedDefaults completes a buffered configuration; the lease derives
// from the handler timeout.
func (c *Config) setBufferedDefaults(handlerTimeout time.Duration) error {
	if c.Buffered == nil {
		return nil
	}
	b := *c.Buffered // the caller's copy stays as it was
	b.setDefaults(handlerTimeout)
	c.Buffered = &b
	return b.validate()
}

// Validate reports a configuration the runtime cannot work with.
func (c *Config) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("consumer name is empty")
	case c.AMQPURL == "":
		return errors.New("AMQP URL is empty")
	case c.Workers < 1 || c.Prefetch < c.Workers:
		return fmt.Errorf("need 1 <= workers (%d) <= prefetch (%d)", c.Workers, c.Prefetch)
	case c.MaxAttempts < 1:
		return fmt.Errorf("max attempts %d < 1", c.MaxAttempts)
	case c.PauseAfterFailures == 1 || c.PauseAfterFailures < -1:
		return fmt.Errorf("pause after failures %d: want -1 (never) or at least 2 distinct messages", c.PauseAfterFailures)
	case c.MaxHolds < 1:
		return fmt.Errorf("max holds %d < 1", c.MaxHolds)
	case c.Committers < 1 || c.GroupCommitMax < 1 || c.GroupCommitWait < 0:
		return fmt.Errorf("need committers (%d) >= 1, group commit max (%d) >= 1, wait (%s) >= 0",
			c.Committers, c.GroupCommitMax, c.GroupCommitWait)
	case c.Decoder != nil && c.KeyFromBody != nil:
		return errors.New("a Decoder and a KeyFromBody: the Decoder's ID replaces KeyFromBody, give one of them")
	case c.Decoder != nil && c.Buffered != nil && c.Buffered.OrderingKey != nil:
		return errors.New("a Decoder and a buffered OrderingKey: the Decoder's OrderingKey replaces it, give one of them")
	}
	return nil
}

// Runtime consumes one queue with a Handler. Create it with New and call Run.
// Three parts of it have their own types: the door (a delivery becomes a
// message), the judge (what a failure is) and the mover (a delivery moved on
// the broker: retried, held, dead-lettered, returned).
type Runtime struct {
	cfg      Config
	door     door
	judge    judge
	mover    mover
	nodes    *rabbit.Nodes     // the broker's nodes (AMQP_URL)
	node     amqpsession.Nodes // the last session's node; Run's goroutine only
	inbox    *inbox.Inbox
	mode     mode // the inline or the buffered inbox
	inFlight inFlight
	handler  Handler
	metrics  *Metrics
	log      *slog.Logger
	ready    atomic.Bool
	// held counts deliveries taken by workers and not yet finished; progress is
	// when one last finished (or when held rose from zero), in Unix nanoseconds.
	held     atomic.Int64
	progress atomic.Int64
	// pausedFor names the cause of a pause in progress, nil when not paused.
	pausedFor atomic.Pointer[Cause]
	// stopBy is when a graceful stop must be over, set once when the stop
	// begins (markStopping), which closes stopping.
	stopOnce sync.Once
	stopBy   time.Time
	stopping chan struct{}
	// applyTimeout bounds a whole inbox transaction (claim, handler, commit), so
	// a database that goes silent cannot wedge a worker until TCP gives up.
	applyTimeout time.Duration
	// frameMax is the publishing connection's frame size, for admit's check
	// that a copy of a delivery fits one frame (0: not checked).
	frameMax atomic.Int64
}

// New builds a runtime. The handler is wrapped with Recover, Observe and, if
// handlerTimeout > 0, Timeout.
func New(cfg Config, ib *inbox.Inbox, h Handler, handlerTimeout time.Duration, m *Metrics, log *slog.Logger) (*Runtime, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer %s: %w", cfg.Name, err)
	}
	if err := cfg.setBufferedDefaults(handlerTimeout); err != nil {
		return nil, fmt.Errorf("consumer %s: %w", cfg.Name, err)
	}
	nodes, err := rabbit.ParseNodes(cfg.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: AMQP URL: %w", cfg.Name, err)
	}
	r := &Runtime{cfg: cfg, nodes: nodes, inbox: ib, metrics: m, log: log.With("consumer", cfg.Name), applyTimeout: time.Hour,
		stopping: make(chan struct{})}
	assemble(r)
	r.inFlight.ids = map[string]chan struct{}{}
	mws := []Middleware{Recover(r.onPanic), Observe(m, cfg.Name)}
	if handlerTimeout > 0 {
		mws = append(mws, Timeout(handlerTimeout))
		r.applyTimeout = handlerTimeout + applyMargin
	}
	r.handler = Chain(h, mws...)
	if r.cfg.StallTimeout == 0 {
		// The longest one delivery can take: its transaction, then a retry or
		// dead-letter publish with its confirm and the pause after a failed one.
		r.cfg.StallTimeout = r.applyTimeout + publishTimeout + 5*time.Second
	}
	if cfg.Buffered != nil {
		r.mode = newBufferedMode(r, *cfg.Buffered)
	} else {
		r.mode = newInlineMode(r, ib)
	}
	m.ready.WithLabelValues(cfg.Name).Set(0)
	return r, nil
}

// assemble gives the runtime's parts their share of it.
func assemble(r *Runtime) *Runtime {
	r.door = door{cfg: &r.cfg, metrics: r.metrics, log: r.log, frameMax: &r.frameMax}
	r.judge = judge{cfg: &r.cfg}
	r.mover = mover{cfg: &r.cfg, metrics: r.metrics, log: r.log, door: &r.door}
	return r
}

func (r *Runtime) stage(s Stage) {
	if r.cfg.OnStage != nil {
		r.cfg.OnStage(s)
	}
}

// LookupReaders is how many inbox look-ups run at once, each on one pooled
// connection; a pool needs Committers + LookupReaders connections.
const LookupReaders = 2

// applyMargin is the time a message gets beyond the handler's own timeout: the
// inbox look-up, then waiting for a committer and its transaction (the claim
// may wait for a concurrent duplicate's). It also bounds one batch.
const applyMargin = 15 * time.Second

// CommitTimeout bounds one commit transaction (and one inbox look-up):
// configuration checks relate the database's own timeouts to it.
const CommitTimeout = applyMargin

// RetryJitter is the largest fraction of a retry delay the jitter cuts off:
// configuration checks need the shortest time the retries can take.
const RetryJitter = retryJitter

func (r *Runtime) onPanic(msg Message, v any, stack []byte) {
	r.metrics.panics.WithLabelValues(r.cfg.Name).Inc()
	r.door.messageLogger(msg, 0, false).Error("handler panicked", "panic", fmt.Sprint(v), "stack", string(stack))
}

// Ready reports nil while the runtime is connected, has declared its topology
// and is consuming, and its workers make progress: a replica whose workers all
// hang on held deliveries (a wedged handler, a driver stuck past its timeouts)
// is not ready, although its connection is fine.
func (r *Runtime) Ready() error {
	if cause := r.pausedFor.Load(); cause != nil {
		return fmt.Errorf("paused: %s is failing every message; resuming by itself", *cause)
	}
	if err := r.mode.ready(); err != nil {
		return err
	}
	if !r.ready.Load() {
		return errors.New("not consuming: broker disconnected or database unavailable")
	}
	if held := r.held.Load(); held > 0 {
		if idle := time.Since(time.Unix(0, r.progress.Load())); idle > r.cfg.StallTimeout {
			return fmt.Errorf("stalled: %d deliveries held, none finished for %s", held, idle.Round(time.Second))
		}
	}
	return nil
}

// Collectors are the runtime's gauges read at each scrape, for alerts that
// must not wait for a probe: consumer_paused (1 while a pause lasts) and
// consumer_stalled_seconds (how long the workers have held deliveries
// without finishing any; 0 while they finish some or hold none).
func (r *Runtime) Collectors() []prometheus.Collector {
	labels := prometheus.Labels{"consumer": r.cfg.Name}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "consumer_paused", ConstLabels: labels,
			Help: "1 while consumption (buffered mode: processing) is paused because the infrastructure fails every message (consumer_pauses_total says why).",
		}, func() float64 {
			// The buffered mode's processing pauses on its own (its
			// mode's readiness says so) while its ingest goes on.
			if r.pausedFor.Load() != nil || r.mode.ready() != nil {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "consumer_stalled_seconds", ConstLabels: labels,
			Help: "Seconds the workers have held deliveries without finishing any; 0 while they finish some or hold none. Readiness fails above the stall timeout.",
		}, func() float64 {
			if r.held.Load() == 0 {
				return 0
			}
			return time.Since(time.Unix(0, r.progress.Load())).Seconds()
		}),
	}
}

// track counts a delivery as held until the returned function is called.
func (r *Runtime) track() (done func()) {
	if r.held.Add(1) == 1 {
		r.progress.Store(time.Now().UnixNano()) // idle until now is not a stall
	}
	return func() {
		r.progress.Store(time.Now().UnixNano())
		r.held.Add(-1)
	}
}

func (r *Runtime) setReady(ok bool) {
	r.ready.Store(ok)
	v := 0.0
	if ok {
		v = 1
	}
	r.metrics.ready.WithLabelValues(r.cfg.Name).Set(v)
}

// Run consumes until ctx is cancelled, then shuts down gracefully: it stops
// taking deliveries, lets in-flight messages finish within ShutdownTimeout (their
// ack goes out after their commit), and closes channel and connection. A message
// still running after the timeout is abandoned unacked and redelivered later.
// Lost connections and database outages are survived inside Run; it returns nil
// after a clean shutdown. It returns an error only for what no reconnect can
// mend: a queue or exchange of the topology that the broker holds with other
// arguments (a *rabbit.MismatchError), after stopping as at a shutdown.
func (r *Runtime) Run(ctx context.Context) error {
	// The committers outlive every session: workers draining at shutdown
	// still commit. The mode starts its own (the inline mode's committers
	// and look-up readers, the buffered mode's finishers) and its processing
	// (the buffered mode's, which works from the table, broker or not, and
	// drains its workers at a stop while the committers still run).
	commitCtx, stopCommits := context.WithCancel(context.WithoutCancel(ctx))
	var committers, processing sync.WaitGroup
	defer func() { stopCommits(); committers.Wait() }()
	defer context.AfterFunc(ctx, r.markStopping)()
	ctx, stop := context.WithCancel(ctx) // a fatal error stops the processing too
	defer stop()
	r.mode.start(ctx, commitCtx, &committers, &processing)
	defer processing.Wait()
	defer stop() // before the wait
	backoff := amqpsession.NewBackoff(amqpsession.FirstWait, r.cfg.ReconnectMaxWait)
	session := func(ctx context.Context) error {
		err := r.session(ctx)
		r.setReady(false)
		return err
	}
	return amqpsession.Loop(ctx, backoff, session, func(err error) error {
		if mismatch := (*rabbit.MismatchError)(nil); errors.As(err, &mismatch) {
			r.log.Error("the broker holds the topology with other arguments: stopping", "err", err)
			return err
		}
		var paused errPausedSession
		if errors.As(err, &paused) {
			r.metrics.pauses.WithLabelValues(r.cfg.Name, paused.cause.String()).Inc()
			r.pausedFor.Store(&paused.cause)
			wait := backoff.Next()
			r.log.Error("paused: not the messages' fault; held ones were put back without spending an attempt",
				"cause", paused.cause, "wait", wait.String())
			if err := r.waitToResume(ctx, paused.cause, wait, backoff); err != nil {
				return err
			}
			r.pausedFor.Store(nil)
			r.log.Info("resuming", "cause", paused.cause)
			return nil
		}
		r.metrics.reconnects.WithLabelValues(r.cfg.Name).Inc()
		wait := backoff.Next()
		r.log.Warn("broker session ended; reconnecting", "err", err, "wait", wait.String())
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
		return nil
	})
}

// waitToResume waits out a pause: at least wait, and for the database until
// its check passes (with growing waits in between). A dependency the runtime
// cannot check is tried again by resuming: if it still fails, the next pause
// waits longer.
func (r *Runtime) waitToResume(ctx context.Context, cause Cause, wait time.Duration, b *amqpsession.Backoff) error {
	if !sleep(ctx, wait) {
		return ctx.Err()
	}
	for cause == causeDatabase {
		if r.judge.pingDatabase(ctx) == nil {
			if r.cfg.ResetDatabase != nil {
				r.cfg.ResetDatabase()
			}
			return nil
		}
		if !sleep(ctx, b.Next()) {
			return ctx.Err()
		}
	}
	return nil
}

// sleep waits d, or until ctx ends: it reports whether it waited all of d.
func sleep(ctx context.Context, d time.Duration) bool { return amqpsession.Sleep(ctx, d) }
