// Package service is the kit's entry point: Run wires a consumer service from
// its Options (configuration, database and migrations, metrics, health and
// readiness, fault endpoints, inbox pruning and the shutdown order once its
// context ends: the main cancels it on a signal),
// so that a service is a handler, a migration and a short main.
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/health"
	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/internal/retention"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// Run runs the service until ctx is cancelled (a signal), then shuts it down
// in order. With the argument "healthcheck" it only probes the running
// service's /readyz, for container health checks in images without a shell.
func Run(ctx context.Context, opts Options, args []string, stdout io.Writer) error {
	cfg, err := LoadConfig(opts)
	if err != nil {
		return err
	}
	switch {
	case len(args) == 1 && args[0] == "healthcheck":
		// Readiness, not liveness: a container is healthy once it consumes.
		return health.Probe(ctx, localURL(cfg.HTTPAddr)+"/readyz")
	case len(args) > 0:
		return fmt.Errorf("unknown arguments %q; usage: %s [healthcheck]", args, opts.Name)
	}
	log := logging.New(stdout, cfg.LogLevel, opts.Name)
	log.Info("starting", "config", startingValues(opts, &cfg))
	db, err := openDatabase(ctx, opts, cfg, log)
	if err != nil {
		return err
	}
	defer database.Close(db)
	warnUnfinished(ctx, cfg, db, log)
	// Readiness and the pause logic ask a connection of their own: a pool busy
	// with workers must not look like an outage.
	checker, err := database.NewChecker(cfg.URL)
	if err != nil {
		return err
	}
	defer checker.Close()
	// One check at a time, shared by whoever asks meanwhile: the workers'
	// pause checks (a burst when an outside call times out for all of them),
	// readiness and the readiness metric.
	check := health.Shared(checker.Check)
	// The handlers' reads have a pool of read-only sessions of their own:
	// one round trip a statement, where a read-only transaction on the
	// service's pool costs a BEGIN and a COMMIT more.
	reader, err := database.OpenReader(ctx, database.Options{
		URL: cfg.URL, MaxConns: readerConns(opts, cfg), StatementTimeout: cfg.StatementTimeout, AppName: opts.Name + " reader",
	}, log)
	if err != nil {
		return err
	}
	defer reader.Close()
	tracer, shutdown, err := tracing.Start(ctx, cfg.Config, tracing.Setup{Name: opts.Name, Stdout: stdout, Log: log, Processor: opts.TraceProcessor})
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	defer func() {
		if err := tracing.Shutdown(shutdown, tracing.FlushTimeout); err != nil {
			log.Warn("tracing", "err", err)
		}
	}()
	reg := newRegistry()
	k := &Kit{Config: cfg, DB: db, Reader: reader, Log: log, Metrics: reg, Tracer: tracer}
	if cfg.FaultsEnabled {
		// nil unless FAULTS_ENABLED: every crash point is then a no-op
		k.Crasher = faults.NewCrasher()
		log.Warn("fault injection enabled: POST /faults/crash arms crash points")
	}
	tasks, err := newOutbox(opts, k)
	if err != nil {
		return err
	}
	rt, err := newRuntime(opts, k, check)
	if err != nil {
		return err
	}
	if opts.Tasks != nil {
		own, err := opts.Tasks(k)
		if err != nil {
			return fmt.Errorf("build the service's tasks: %w", err)
		}
		tasks = append(tasks, own...)
	}
	pruner, err := newPruner(cfg, db, k.Metrics, log)
	if err != nil {
		return err
	}
	// Probes, scrapes and fault calls are small and quick: bounded reads,
	// headers, writes (a CPU profile takes 30 s) and idle keep-alives.
	srv := &http.Server{Addr: cfg.HTTPAddr, Handler: newMux(k, reg, rt, tasks, check),
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 60 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 16 << 10}
	return explainMismatch(cfg, serve(ctx, srv, rt, pruner, tasks, cfg.ShutdownTimeout, log))
}

// newOutbox gives a service that publishes (Options.Publishes) its outbox
// and the relay that publishes it, as the kit's first task.
func newOutbox(opts Options, k *Kit) ([]Task, error) {
	if len(opts.Publishes) == 0 {
		return nil, nil
	}
	cfg := k.Config
	k.Outbox = outbox.New(cfg.Consumer, opts.Publishes...).Traced(k.Tracer)
	sqlDB, err := k.DB.DB()
	if err != nil {
		return nil, err
	}
	var onPublished func()
	if k.Crasher != nil {
		k.Crasher.Declare(faults.AfterOutboxPublish)
		onPublished = func() { k.Crasher.Hit(faults.AfterOutboxPublish) }
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		AMQPURL:          cfg.AMQPURL,
		Heartbeat:        cfg.Heartbeat,
		Name:             opts.Name,
		Exchanges:        opts.Publishes,
		Batch:            cfg.OutboxBatch,
		PollInterval:     cfg.OutboxPollInterval,
		Lease:            cfg.OutboxLease,
		RetryDelays:      cfg.OutboxRetryDelays,
		MaxAttempts:      cfg.OutboxMaxAttempts,
		ListenURL:        cfg.URL,
		ReconnectMaxWait: cfg.ReconnectMaxWait,
		OnPublished:      onPublished,
	}, outbox.NewStore(sqlDB, cfg.Consumer), k.Outbox, outbox.NewMetrics(k.Metrics), k.Log)
	if err != nil {
		return nil, err
	}
	return []Task{{Name: "outbox", Run: relay.Run, Ready: relay.Ready}}, nil
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// openDatabase opens the pool and applies the kit's inbox schema, then the
// service's own, under advisory locks (replicas starting together never race),
// on a pool of their own (Migrate).
func openDatabase(ctx context.Context, opts Options, cfg Config, log *slog.Logger) (*gorm.DB, error) {
	db, err := database.Open(ctx, database.Options{
		URL:              cfg.URL,
		MaxConns:         cfg.MaxConns - readerConns(opts, cfg), // the rest is the handlers' read-only pool's
		StatementTimeout: cfg.StatementTimeout,
		AppName:          opts.Name,
	}, log)
	if err != nil {
		return nil, err
	}
	applied, _, err := Migrate(ctx, cfg.URL, opts.Name, Schemas(opts), log)
	if err != nil {
		_ = database.Close(db)
		return nil, err
	}
	log.Info("schema up to date", "applied", applied)
	return db, nil
}

// MigrationTimeout is the statement timeout of the sessions that apply
// schemas: at a service's start as in its migrate command.
const MigrationTimeout = 5 * time.Minute

// Migrate applies sets to the database at url, on a pool of its own whose
// statements may take MigrationTimeout, not the service's
// DB_STATEMENT_TIMEOUT: a migration that moves many rows (the buffered
// set's 00003: 18 s for 800,000 waiting messages) would otherwise be rolled
// back at every start, and the service would never come up. It returns the
// versions applied now and each set's version after.
func Migrate(ctx context.Context, url, name string, sets []migrations.Set, log *slog.Logger) (applied map[string][]int64, versions map[string]int64, err error) {
	db, err := database.Open(ctx, database.Options{URL: url, MaxConns: 2, StatementTimeout: MigrationTimeout, AppName: name + " migrate"}, log)
	if err != nil {
		return nil, nil, err
	}
	defer database.Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, err
	}
	if applied, err = migrations.Apply(ctx, sqlDB, sets...); err != nil {
		return nil, nil, err
	}
	versions = map[string]int64{}
	for _, set := range sets {
		if versions[set.Name()], err = migrations.Version(ctx, sqlDB, set); err != nil {
			return nil, nil, err
		}
	}
	return applied, versions, nil
}

// readerConns sizes the handlers' read-only pool, taken out of
// DB_MAX_CONNS: what it leaves beyond the committers, the inbox look-ups,
// the outbox relay and one more, at least 1. The main pool gets the rest.
func readerConns(opts Options, cfg Config) int {
	spare := cfg.MaxConns - cfg.DBCommitters - consumer.LookupReaders
	if len(opts.Publishes) > 0 {
		spare--
	}
	// One of the spare stays with the main pool, for the pruner, the
	// gauges, the buffered mode's settling and operators; the two pools
	// together never hold more than DB_MAX_CONNS.
	return max(spare-1, 1)
}

// Schemas are a service's schemas in the order they are applied: the kit's
// inbox, buffered inbox and outbox, then the service's own.
func Schemas(opts Options) []migrations.Set {
	return append([]migrations.Set{migrations.Inbox, migrations.Buffered, migrations.Outbox}, opts.Migrations...)
}

// RefuseStart stops the service's start with err, from code that runs in
// its handler's constructor and cannot return an error (kit.OutsideCall in
// a service that declares no outside calls): the start fails with err, as
// with a constructor's error. Outside a constructor it is a panic.
func RefuseStart(err error) { panic(startRefusal{err}) }

// startRefusal is RefuseStart's panic.
type startRefusal struct{ err error }

// buildHandler runs the service's constructor; a RefuseStart there is the
// start's error. Any other panic stays one, with its stack: a bug.
func buildHandler(newHandler func(k *Kit) (consumer.Handler, error), k *Kit) (h consumer.Handler, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, ok := p.(startRefusal)
			if !ok {
				panic(p)
			}
			err = r.err
		}
	}()
	return newHandler(k)
}

func newRuntime(opts Options, k *Kit, check func(context.Context) error) (*consumer.Runtime, error) {
	hk := *k
	hk.DB = nil // a handler reads through Reader and writes through its writes' tx
	h, err := buildHandler(opts.NewHandler, &hk)
	if err != nil {
		return nil, fmt.Errorf("build the handler: %w", err)
	}
	cfg := k.Config
	decoder := opts.Decoder
	if decoder != nil {
		// Routed even with one event: a message that reaches the queue
		// through a binding the service does not declare (left by a release
		// that removed an event, or made by a newer replica in a rollout that
		// adds one) is refused, not taken for the first event.
		routes := opts.routes(cfg)
		routes[0].Handler = h
		for i, m := range opts.more {
			if routes[i+1].Handler, err = buildHandler(m.newHandler, &hk); err != nil {
				return nil, fmt.Errorf("build the handler of %s: %w", consumer.EventType(m.decoder), err)
			}
		}
		if decoder, h, err = consumer.Routed(routes); err != nil {
			return nil, fmt.Errorf("route the events: %w", err)
		}
	}
	var onStage func(consumer.Stage)
	if c := k.Crasher; c != nil {
		// A stage and its crash point have the same name.
		onStage = func(s consumer.Stage) { c.Hit(faults.Point(s)) }
	}
	return consumer.New(consumer.Config{
		Name:               cfg.Consumer,
		AMQPURL:            cfg.AMQPURL,
		Heartbeat:          cfg.Heartbeat,
		Topology:           Topology(cfg),
		Prefetch:           cfg.Prefetch,
		Workers:            cfg.Workers,
		Committers:         cfg.DBCommitters,
		GroupCommitMax:     cfg.GroupCommitMax,
		GroupCommitWait:    cfg.GroupCommitWait,
		MaxBodyBytes:       cfg.MaxBodyBytes,
		Decoder:            decoder,
		KeyFromBody:        opts.KeyFromBody,
		LogAttrs:           opts.LogAttrs,
		MaxAttempts:        cfg.MaxAttempts,
		ShutdownTimeout:    cfg.ShutdownTimeout,
		KeyTTL:             cfg.IdempotencyKeyTTL,
		PauseAfterFailures: cfg.PauseAfterFailures,
		MaxHolds:           cfg.MaxHolds,
		ReconnectMaxWait:   cfg.ReconnectMaxWait,
		DatabaseCheck:      check,
		ResetDatabase:      func() { database.Recycle(k.DB); k.Reader.Recycle() },
		OnStage:            onStage,
		Buffered:           bufferedConfig(opts, k),
		Tracer:             k.Tracer,
	}, inbox.New(k.DB, cfg.Consumer), h, cfg.HandlerTimeout, consumer.NewMetrics(k.Metrics), k.Log)
}

// bufferedConfig is the buffered mode's part of the runtime's configuration,
// nil in the inline mode.
func bufferedConfig(opts Options, k *Kit) *consumer.BufferedConfig {
	cfg := k.Config
	if cfg.InboxMode != ModeBuffered {
		return nil
	}
	return &consumer.BufferedConfig{
		Store:        buffered.New(k.DB, cfg.Consumer),
		OrderingKey:  opts.OrderingKey,
		RetryDelays:  cfg.BufferRetryDelays,
		MaxAttempts:  cfg.BufferMaxAttempts,
		PollInterval: cfg.BufferPollInterval,
		ListenURL:    cfg.URL,
	}
}

// warnUnfinished logs an error in the inline mode if the buffered inbox still
// holds messages to process: the inline mode never processes them.
func warnUnfinished(ctx context.Context, cfg Config, db *gorm.DB, log *slog.Logger) {
	if cfg.InboxMode == ModeBuffered {
		return
	}
	st, err := buffered.New(db, cfg.Consumer).Stats(ctx, false)
	if err != nil {
		return
	}
	if n := st.Counts[buffered.StatusPending] + st.Counts[buffered.StatusProcessing] + st.Counts[buffered.StatusFailed] + st.Counts[buffered.StatusParked]; n > 0 {
		log.Error("the buffered inbox holds messages the inline mode never processes: run with INBOX_MODE=buffered until inboxctl inbox status shows none",
			"unfinished", n)
	}
}

// Topology is the broker topology of a service's configuration.
func Topology(cfg Config) rabbit.Topology {
	return rabbit.Topology{
		Exchange:           cfg.Exchange,
		RoutingKey:         cfg.RoutingKey,
		MoreBindings:       cfg.MoreBindings,
		Queue:              cfg.Queue,
		DeadLetterExchange: cfg.DeadLetterEx,
		DeadLetterQueue:    cfg.DeadLetterQueue,
		DeliveryLimit:      cfg.DeliveryLimit,
		RetryDelays:        cfg.RetryDelays,
		SingleActive:       cfg.SingleActiveConsumer,
		QuorumGroupSize:    cfg.QueueReplicas,
	}
}

// newPruner is the inbox retention: every replica runs it, one prunes at a time.
func newPruner(cfg Config, db *gorm.DB, reg prometheus.Registerer, log *slog.Logger) (*retention.Pruner, error) {
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	return retention.New(sqlDB, PruneConfig(cfg), retention.NewMetrics(reg), log)
}

// PruneConfig is the inbox retention of a service's configuration.
func PruneConfig(cfg Config) retention.Config {
	return retention.Config{
		Consumer:    cfg.Consumer,
		Window:      cfg.InboxRetention,
		BatchSize:   cfg.InboxPruneBatch,
		Pause:       retention.DefaultPause,
		Interval:    cfg.InboxPruneInterval,
		RetryDelays: cfg.RetryDelays,
		MaxAttempts: cfg.MaxAttempts,
		Buffered:    true, // Schemas applies the buffered and outbox sets in every mode
		Outbox:      true,
	}
}

// newMux serves the operational endpoints. The database's check dials a
// session of its own each time (it sees a failover or a database turned
// read-only at once): /readyz and the readiness metric share one run a
// second (health.Cached), so that a prober or a scraper polling often costs
// the database one session a second, and a dial slower than a probe's budget
// still answers the next probe. The runtime's pause checks share its runs
// (health.Shared) but keep no answer.
func newMux(k *Kit, reg prometheus.Gatherer, rt *consumer.Runtime, tasks []Task, check health.Check) *http.ServeMux {
	checks := map[string]health.Check{
		"consumer": func(context.Context) error { return rt.Ready() },
		"database": health.Cached(check, time.Second),
	}
	for _, t := range tasks {
		if t.Ready != nil {
			checks[t.Name] = func(context.Context) error { return t.Ready() }
		}
	}
	k.Metrics.MustRegister(health.Readiness(checks))
	k.Metrics.MustRegister(rt.Collectors()...)
	mux := health.Mux(reg, checks)
	if k.Crasher != nil {
		mux.Handle("/faults/", k.Crasher.Handler(k.Config.FaultsToken))
	}
	if k.Config.PprofEnabled {
		health.Pprof(mux)
		k.Log.Warn("profiling enabled: /debug/pprof/ is served on HTTP_ADDR")
	}
	return mux
}

// serve runs the HTTP server, the consumer, the inbox pruner and the tasks
// (the outbox relay) until ctx is cancelled, the server fails or a task
// fails, then stops the consumer (it waits for in-flight messages), the
// pruner (its batch in flight rolls back), the tasks once the consumer has
// stopped (the relay publishes what the drain committed), and the server
// last, so readiness stays observable during the drain. A task still running
// when the stop's budget (SHUTDOWN_TIMEOUT from the stop) is spent is left:
// what it leased comes back by itself (the relay's rows, when their lease ends).
func serve(ctx context.Context, srv *http.Server, rt *consumer.Runtime, pruner *retention.Pruner, tasks []Task,
	budget time.Duration, log *slog.Logger) error {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", srv.Addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopBy := make(chan time.Time, 1)
	defer context.AfterFunc(ctx, func() { stopBy <- time.Now().Add(budget) })()
	srvErr := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		srvErr <- err
		cancel()
	}()
	log.Info("serving", "addr", ln.Addr().String())
	var pruning sync.WaitGroup
	pruning.Go(func() { pruner.Run(ctx) })
	// The tasks outlive the consumer's drain: the relay publishes what the
	// last messages committed.
	taskCtx, stopTasks := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTasks()
	taskErrs := make(chan error, len(tasks))
	var running sync.WaitGroup
	for _, t := range tasks {
		running.Go(func() {
			if err := t.Run(taskCtx); err != nil && taskCtx.Err() == nil {
				taskErrs <- fmt.Errorf("%s: %w", t.Name, err)
				cancel()
			}
		})
	}
	rtErr := rt.Run(ctx)
	log.Info("consumer stopped; shutting down")
	cancel()
	pruning.Wait()
	stopTasks()
	waitUntil(&running, <-stopBy, log)
	close(taskErrs)
	errs := []error{rtErr}
	for err := range taskErrs {
		errs = append(errs, err)
	}
	// The server only answers probes and scrapes: its stop is short, and
	// bounded apart from the consumer's, whose budget is spent by now.
	shutdownCtx, done := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer done()
	err = errors.Join(append(errs, srv.Shutdown(shutdownCtx), <-srvErr)...)
	if err == nil {
		log.Info("stopped cleanly")
	}
	return err
}

// waitUntil waits for the tasks until deadline, and leaves them running after it.
func waitUntil(wg *sync.WaitGroup, deadline time.Time, log *slog.Logger) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Warn("a task outlived the stop's budget; leaving it (what it leased comes back by itself)")
	}
}

// httpShutdownTimeout bounds the HTTP server's stop after the consumer's.
const httpShutdownTimeout = 2 * time.Second

// localURL turns a listen address such as ":8080" into a URL on loopback.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// startingValues is the configuration the start-up log shows: what applies
// to this service (no OUTBOX_* for one that publishes nothing, no
// IDEMPOTENCY_KEY_TTL for one with no outside calls), secrets masked.
func startingValues(opts Options, cfg *Config) map[string]string {
	v := LogValue(cfg, cfg.settings)
	for name := range v {
		if (len(opts.Publishes) == 0 && strings.HasPrefix(name, "OUTBOX_")) || (opts.NoOutsideCalls && name == "IDEMPOTENCY_KEY_TTL") {
			delete(v, name)
		}
	}
	return v
}

// Topology is the broker topology of the configuration: the service's
// exchange, queue, binding and dead-letter names.
func (c Config) Topology() rabbit.Topology { return Topology(c) }
