package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/kelseyhightower/envconfig"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// Options describe one service: what it is called, what it consumes, its own
// settings, its schema and its handler. Everything else is the kit's.
type Options struct {
	// Name is the service's name, e.g. "shipping-service": the consumer label
	// of the inbox and the metrics, the program name in logs, the database's
	// application_name, and the root of the derived names below.
	Name string
	// Event is the event the service consumes, e.g. "order-paid". The work
	// queue is <Name>.<Event>, the dead-letter exchange <Name>.dlx, the
	// dead-letter queue <queue>.dlq and the retry queues <queue>.retry.<delay>.
	Event string
	// Exchange and RoutingKey say what to consume. The kit has no default: a
	// service that sets neither here nor in EXCHANGE and ROUTING_KEY refuses to
	// start, naming the variable.
	Exchange, RoutingKey string
	// Queue, DeadLetterExchange and DeadLetterQueue replace the derived names
	// (the payment service keeps the names it was released with). Database is
	// the database name of DATABASE_URL's default (default: Name with
	// underscores).
	Queue, DeadLetterExchange, DeadLetterQueue, Database string

	// Settings points to the handler's own configuration struct, loaded from
	// the environment with envconfig next to the kit's (GATEWAY_URL, say).
	// WithSettings sets it, typed; set by hand it must be a pointer to a
	// struct.
	Settings any
	// Check validates Settings against the kit's configuration, adding a
	// failure per variable to v (a timeout that must stay below
	// HANDLER_TIMEOUT, say).
	Check func(cfg *Config, v *Checks)

	// Migrations are the service's own schemas, applied at start after the
	// kit's inbox schema, each with its own version table.
	Migrations []migrations.Set
	// NewHandler builds the handler once configuration and database are ready.
	// Consume and ConsumeWithSettings set it with Decoder, for a handler
	// typed to the Decoder's event (consumer.HandlerOf): prefer them, a
	// mismatch of the two set by hand is found only at run time.
	NewHandler func(k *Kit) (consumer.Handler, error)
	// Decoder decodes each body once, before the handler runs
	// (consumer.Events; Consume sets it): the handler gets the event (as
	// HandlerOf's argument; an untyped handler as msg.Event), a body the
	// Decoder refuses is dead-lettered with its reason before any handler
	// runs, and the Decoder's ID and OrderingKey replace KeyFromBody and
	// OrderingKey below.
	Decoder consumer.Decoder
	// KeyFromBody finds the dedupe key in a body without a message_id property;
	// nil requires the property (unless the Decoder gives an ID).
	KeyFromBody func(body []byte) string
	// LogAttrs names the business entity on every log line about a message
	// (and in `dlq list`); it must not fail.
	LogAttrs func(body []byte) []slog.Attr
	// Publishes names the topic exchanges the service emits events to through
	// its outbox: with any, the kit gives the handler Kit.Outbox (enqueue from
	// the writes, in the inbox transaction), runs the outbox relay in every
	// replica and declares these exchanges (durable, topic) at each connect.
	Publishes []string
	// Tasks, if set, returns the service's own background tasks, built once
	// the kit is ready: each runs under the kit's context from the start until
	// the stop (when the consumer stops), with the kit's pool open until it
	// ends, and adds its readiness to /readyz.
	Tasks func(k *Kit) ([]Task, error)
	// OrderingKey names a message's ordering key in the buffered mode
	// (INBOX_MODE=buffered): messages of one key are processed one at a time,
	// in the order they were stored; "" for a body makes that message a key
	// of its own. It must not fail. Without it the buffered mode refuses to
	// start unless the service declares Unordered.
	OrderingKey func(body []byte) string
	// Unordered declares that the service needs no order between its
	// messages: the buffered mode then runs without an OrderingKey, every
	// message a key of its own.
	Unordered bool
	// Requires pins the kit settings the service depends on. An unset
	// variable takes the pinned value; one set to the same value is fine; one
	// that contradicts it refuses to start, naming the variable and both
	// values.
	Requires Requirements
	// NoOutsideCalls declares that the handler calls no service that
	// remembers idempotency keys (its effects are its database writes): the
	// key-expiry guard is off, IDEMPOTENCY_KEY_TTL does not apply (setting
	// it refuses to start) and dlq replay has no age limit.
	NoOutsideCalls bool
	// TraceProcessor, if set, receives every span of the service, whatever
	// OTEL_TRACES_EXPORTER says, and turns tracing on: tests record the
	// spans in memory with it (tracetest.SpanRecorder).
	TraceProcessor sdktrace.SpanProcessor

	// invalid says why the options were built wrong (WithSettings).
	invalid string
	// typed: WithSettings built these options; the handler gets each load's
	// settings from its Config, never through Settings.
	typed bool
	// event is the handler's event type when Consume wired it: the Decoder
	// must still decode that type.
	event reflect.Type
	// more are the further events ConsumeAlso added, each on a binding key
	// of its own.
	more []moreEvents
}

// routes are the service's events as the runtime routes them, without their
// handlers: the first on EXCHANGE and ROUTING_KEY, then each ConsumeAlso's
// (cfg.MoreBindings, their exchanges filled in).
func (o *Options) routes(cfg Config) []consumer.Route {
	routes := []consumer.Route{{Exchange: cfg.Exchange, Key: cfg.RoutingKey, Decoder: o.Decoder}}
	for i, m := range o.more {
		b := cfg.MoreBindings[i]
		routes = append(routes, consumer.Route{Exchange: b.Exchange, Key: b.Key, Decoder: m.decoder})
	}
	return routes
}

// moreEvents is one further event of a service (ConsumeAlso).
type moreEvents struct {
	binding    rabbit.Binding
	decoder    consumer.Decoder
	newHandler func(k *Kit) (consumer.Handler, error)
}

// Requirements are kit settings a service pins (Options.Requires).
type Requirements struct {
	// Mode is the inbox mode, ModeInline or ModeBuffered (INBOX_MODE); ""
	// leaves it to the environment. A service that needs order per key
	// requires ModeBuffered.
	Mode string
	// SingleActiveConsumer requires SINGLE_ACTIVE_CONSUMER=true: one
	// replica consumes the work queue at a time, in the broker's order.
	SingleActiveConsumer bool
}

// apply pins the required settings into cfg, and records a failure for
// each variable the environment sets to another value.
func (r Requirements) apply(name string, cfg *Config, v *Checks) {
	if r.Mode != "" {
		_, set := os.LookupEnv("INBOX_MODE")
		v.Require(!set || cfg.InboxMode == r.Mode, "INBOX_MODE",
			"is %q, but %s requires %q (kit.Service.Requires): unset INBOX_MODE or set it to %q", cfg.InboxMode, name, r.Mode, r.Mode)
		cfg.InboxMode = r.Mode
	}
	if r.SingleActiveConsumer {
		_, set := os.LookupEnv("SINGLE_ACTIVE_CONSUMER")
		v.Require(!set || cfg.SingleActiveConsumer, "SINGLE_ACTIVE_CONSUMER",
			"is false, but %s requires true (kit.Service.Requires): unset SINGLE_ACTIVE_CONSUMER or set it to true", name)
		cfg.SingleActiveConsumer = true
	}
}

// Kit is what a handler may use: the loaded configuration, reads of the service's
// database, its logger and metrics registry, and the crash points (nil unless
// FAULTS_ENABLED; wrap a side effect with faults.After to declare one).
type Kit struct {
	Config Config
	// DB is the service's pool, for its background tasks (Options.Tasks);
	// nil in the Kit handed to NewHandler: a handler writes only through the
	// tx of its writes, and reads through Reader.
	DB *gorm.DB
	// Reader runs a handler's reads (in Handle, before its writes) on a pool
	// of read-only sessions of their own, sized by what DB_MAX_CONNS leaves
	// beyond the committers, the look-ups and the relay.
	Reader  database.Reader
	Log     *slog.Logger
	Metrics prometheus.Registerer
	Crasher *faults.Crasher
	// Tracer makes the handler's own spans (an outside call) under the
	// message's process span, which the handler's ctx carries; nil when
	// tracing is off, and its methods then do nothing.
	Tracer *tracing.Tracer
	// Outbox adds the events a handler emits from its writes (nil unless the
	// service declares Publishes).
	Outbox *outbox.Outbox
}

// Task is a background task of a service (Options.Tasks).
type Task struct {
	Name string
	// Run runs until ctx ends; an error it returns before that stops the
	// service.
	Run func(ctx context.Context) error
	// Ready, if set, is the task's readiness check on /readyz.
	Ready func() error
}

func (o *Options) validate() error {
	switch {
	case o.Name == "":
		return errors.New("service options: Name is empty")
	case o.Event == "" && o.Queue == "":
		return errors.New("service options: Event is empty and no Queue is given")
	case o.invalid != "":
		return errors.New("service options: " + o.invalid)
	case o.NewHandler == nil:
		return errors.New("service options: NewHandler is nil")
	case o.event != nil && consumer.EventType(o.Decoder) != o.event:
		return fmt.Errorf("service options: the handler was wired for %s events, but the Decoder decodes %v: "+
			"the Decoder was replaced after Consume; give Consume the Events instead", o.event, consumer.EventType(o.Decoder))
	case o.Settings != nil && !pointerToStruct(o.Settings):
		return fmt.Errorf("service options: Settings must be a pointer to a struct (&Settings{}), got %T", o.Settings)
	case slices.Contains(o.Publishes, ""):
		return errors.New("service options: Publishes names an empty exchange")
	case o.Requires.Mode != "" && o.Requires.Mode != ModeInline && o.Requires.Mode != ModeBuffered:
		return fmt.Errorf("service options: Requires.Mode is %q, want %q or %q", o.Requires.Mode, ModeInline, ModeBuffered)
	case o.Unordered && o.ordered():
		return errors.New("service options: Unordered and an OrderingKey contradict each other")
	case o.Decoder != nil && o.KeyFromBody != nil:
		return errors.New("service options: the Decoder's ID replaces KeyFromBody: give one of them")
	case o.Decoder != nil && o.OrderingKey != nil:
		return errors.New("service options: the Decoder's OrderingKey replaces OrderingKey: give one of them")
	}
	return nil
}

// LoadConfig reads the kit's configuration and the service's Settings from the
// environment, fills the names the environment leaves unset from the options,
// and validates both. Every error names its variable.
func LoadConfig(opts Options) (Config, error) {
	if err := opts.validate(); err != nil {
		return Config{}, err
	}
	cfg := prefill(opts)
	// envconfig keeps a field whose variable is unset and has no default tag.
	if err := envconfig.Process("", &cfg); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	if opts.Settings != nil {
		// Each load fills a new value: one that fails, or a later one with a
		// variable unset, never changes the settings an earlier load handed
		// out (WithSettings). Settings set by hand are copied into the
		// caller's struct, which its closures read: there a later load does
		// change them.
		fresh := reflect.New(reflect.TypeOf(opts.Settings).Elem())
		if err := envconfig.Process("", fresh.Interface()); err != nil {
			return Config{}, fmt.Errorf("configuration: %w", err)
		}
		cfg.settings = fresh.Interface()
		if !opts.typed {
			reflect.ValueOf(opts.Settings).Elem().Set(fresh.Elem())
		}
	}
	cfg.derive(opts)
	for _, m := range opts.more {
		b := m.binding
		if b.Exchange == "" {
			b.Exchange = cfg.Exchange
		}
		cfg.MoreBindings = append(cfg.MoreBindings, b)
	}
	var v Checks
	opts.Requires.apply(opts.Name, &cfg, &v)
	if opts.NoOutsideCalls {
		_, set := os.LookupEnv("IDEMPOTENCY_KEY_TTL")
		v.Require(!set, "IDEMPOTENCY_KEY_TTL", "is set, but %s declares no outside calls (kit.Service.NoOutsideCalls): "+
			"no idempotency key is kept anywhere, so it does not apply; unset it", opts.Name)
		cfg.IdempotencyKeyTTL, cfg.noOutsideCalls = 0, true
	}
	v.Require(!slices.Contains(cfg.MoreBindings, rabbit.Binding{Exchange: cfg.Exchange, Key: cfg.RoutingKey}), "ROUTING_KEY",
		"is %q on EXCHANGE %q, the binding of one of %s's further events (kit.ConsumeAlso) too: give each event its own",
		cfg.RoutingKey, cfg.Exchange, opts.Name)
	if opts.Decoder != nil && cfg.Exchange != "" && cfg.RoutingKey != "" {
		err := consumer.CheckRoutes(opts.routes(cfg))
		v.Require(err == nil, "ROUTING_KEY", "with %s's further events (kit.ConsumeAlso): %v", opts.Name, err)
	}
	v.Require(cfg.InboxMode != ModeBuffered || opts.ordered() || opts.Unordered, "INBOX_MODE",
		"is buffered, but %s gives no OrderingKey: the buffered mode would process its messages in no order; "+
			"give its kit.Events an OrderingKey, declare kit.Service.Unordered, or use the inline mode", opts.Name)
	cfg.validate(&v)
	if len(opts.Publishes) > 0 && !v.Failed("DB_MAX_CONNS", "DB_COMMITTERS") {
		// The relay claims and marks on one more.
		v.Require(cfg.DBCommitters+consumer.LookupReaders+1 <= cfg.MaxConns, "DB_MAX_CONNS",
			"must be at least DB_COMMITTERS + %d look-up readers + 1 for the outbox relay = %d, got %d: raise DB_MAX_CONNS",
			consumer.LookupReaders, cfg.DBCommitters+consumer.LookupReaders+1, cfg.MaxConns)
	}
	if opts.Check != nil {
		opts.Check(&cfg, &v)
	}
	if err := v.Err(); err != nil {
		return Config{}, fmt.Errorf("configuration: %w", err)
	}
	return cfg, nil
}

// prefill sets the defaults that come from the options.
func prefill(opts Options) Config {
	cfg := Config{Consumer: opts.Name}
	cfg.Exchange, cfg.RoutingKey = opts.Exchange, opts.RoutingKey
	cfg.Queue, cfg.DeadLetterEx, cfg.DeadLetterQueue = opts.Queue, opts.DeadLetterExchange, opts.DeadLetterQueue
	cfg.URL = "postgres://postgres@localhost:5432/" + opts.database() + "?sslmode=disable"
	// The runtime's defaults, written once, in the packages that use them.
	c, b, o := consumer.Defaults(), consumer.BufferedDefaults(), outbox.RelayDefaults()
	cfg.Heartbeat, cfg.ReconnectMaxWait = c.Heartbeat, c.ReconnectMaxWait
	cfg.Prefetch, cfg.Workers, cfg.DBCommitters = c.Prefetch, c.Workers, c.Committers
	cfg.GroupCommitMax, cfg.GroupCommitWait = c.GroupCommitMax, c.GroupCommitWait
	cfg.MaxBodyBytes, cfg.RetryDelays, cfg.MaxAttempts = c.MaxBodyBytes, c.Topology.RetryDelays, c.MaxAttempts
	cfg.PauseAfterFailures, cfg.MaxHolds, cfg.ShutdownTimeout = c.PauseAfterFailures, c.MaxHolds, c.ShutdownTimeout
	cfg.BufferRetryDelays, cfg.BufferMaxAttempts, cfg.BufferPollInterval = b.RetryDelays, b.MaxAttempts, b.PollInterval
	cfg.OutboxBatch, cfg.OutboxPollInterval, cfg.OutboxLease = o.Batch, o.PollInterval, o.Lease
	cfg.OutboxRetryDelays, cfg.OutboxMaxAttempts = o.RetryDelays, o.MaxAttempts
	return cfg
}

// derive fills the names still empty: the work queue from the name and the
// event, the dead-letter queue from the work queue.
func (c *Config) derive(opts Options) {
	if c.Queue == "" {
		c.Queue = opts.Name + "." + opts.Event
	}
	if c.DeadLetterEx == "" {
		c.DeadLetterEx = opts.Name + ".dlx"
	}
	if c.DeadLetterQueue == "" {
		c.DeadLetterQueue = c.Queue + ".dlq"
	}
}

func pointerToStruct(v any) bool {
	t := reflect.TypeOf(v)
	return t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct && !reflect.ValueOf(v).IsNil()
}

// ordered reports whether the options name an ordering key.
func (o *Options) ordered() bool {
	if o.OrderingKey != nil || consumer.Ordered(o.Decoder) {
		return true
	}
	for _, m := range o.more {
		if consumer.Ordered(m.decoder) {
			return true
		}
	}
	return false
}

func (o *Options) database() string {
	if o.Database != "" {
		return o.Database
	}
	return strings.ReplaceAll(o.Name, "-", "_")
}
