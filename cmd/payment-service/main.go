// Command payment-service consumes OrderPlaced events and charges each order
// exactly once: transactional inbox, idempotent gateway charge, ack after commit,
// poison messages to the dead-letter exchange.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/config"
	"github.com/inbox-template/payment-service/internal/consumer"
	"github.com/inbox-template/payment-service/internal/database"
	"github.com/inbox-template/payment-service/internal/faults"
	"github.com/inbox-template/payment-service/internal/gateway"
	"github.com/inbox-template/payment-service/internal/health"
	"github.com/inbox-template/payment-service/internal/inbox"
	"github.com/inbox-template/payment-service/internal/logging"
	"github.com/inbox-template/payment-service/internal/migrations"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/internal/rabbit"
	"github.com/inbox-template/payment-service/internal/retention"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "payment-service:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var cfg config.PaymentService
	if err := config.Load(&cfg); err != nil {
		return err
	}
	if len(args) > 0 && args[0] == "healthcheck" {
		// Readiness, not liveness: a container is healthy once it consumes.
		return health.Probe(ctx, localURL(cfg.HTTPAddr)+"/readyz")
	}
	log := logging.New(stdout, cfg.LogLevel, "payment-service")
	log.Info("starting", "config", config.LogValue(&cfg))

	db, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer database.Close(db)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var crasher *faults.Crasher // nil unless FAULTS_ENABLED: every crash point is then a no-op
	if cfg.FaultsEnabled {
		crasher = faults.NewCrasher()
		log.Warn("fault injection enabled: POST /faults/crash arms crash points")
	}
	rt, err := newRuntime(cfg, db, crasher, consumer.NewMetrics(reg), log)
	if err != nil {
		return err
	}
	pruner, err := newPruner(cfg, db, reg, log)
	if err != nil {
		return err
	}
	mux := health.Mux(reg, map[string]health.Check{
		"broker":   func(context.Context) error { return rt.Ready() },
		"database": func(ctx context.Context) error { return database.Ping(ctx, db) },
	})
	if crasher != nil {
		mux.Handle("/faults/", crasher.Handler())
	}
	if cfg.PprofEnabled {
		health.Pprof(mux)
		log.Warn("profiling enabled: /debug/pprof/ is served on HTTP_ADDR")
	}
	srv := &http.Server{Addr: cfg.HTTPAddr, ReadHeaderTimeout: 5 * time.Second, Handler: mux}
	return serve(ctx, srv, rt, pruner, cfg.ShutdownTimeout, log)
}

func openDatabase(ctx context.Context, cfg config.PaymentService, log *slog.Logger) (*gorm.DB, error) {
	db, err := database.Open(ctx, database.Options{
		URL:              cfg.Database.URL,
		MaxConns:         cfg.MaxConns,
		StatementTimeout: cfg.StatementTimeout,
		AppName:          "payment-service",
	}, log)
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	applied, err := migrations.Apply(ctx, sqlDB, migrations.Payments)
	if err != nil {
		database.Close(db)
		return nil, err
	}
	log.Info("schema up to date", "applied", applied)
	return db, nil
}

func newRuntime(cfg config.PaymentService, db *gorm.DB, crasher *faults.Crasher, m *consumer.Metrics, log *slog.Logger) (*consumer.Runtime, error) {
	// One keep-alive connection per worker: each may be in a gateway call.
	var gw payment.Charger = gateway.NewClient(cfg.GatewayURL, cfg.GatewayTimeout, cfg.Workers)
	var onStage func(consumer.Stage)
	if crasher != nil {
		gw, onStage = faults.CrashAfterCharge(gw, crasher), crasher.OnStage
	}
	return consumer.New(consumer.Config{
		Name:      cfg.Consumer,
		AMQPURL:   cfg.AMQPURL,
		Heartbeat: cfg.Heartbeat,
		Topology: rabbit.Topology{
			Exchange:           cfg.Exchange,
			RoutingKey:         cfg.RoutingKey,
			Queue:              cfg.Queue,
			DeadLetterExchange: cfg.DeadLetterEx,
			DeadLetterQueue:    cfg.DeadLetterQueue,
			DeliveryLimit:      cfg.DeliveryLimit,
			RetryDelays:        cfg.RetryDelays,
		},
		Prefetch:         cfg.Prefetch,
		Workers:          cfg.Workers,
		Committers:       cfg.DBCommitters,
		GroupCommitMax:   cfg.GroupCommitMax,
		GroupCommitWait:  cfg.GroupCommitWait,
		MaxBodyBytes:     cfg.MaxBodyBytes,
		KeyFromBody:      payment.EventID,
		LogAttrs:         payment.LogAttrs,
		MaxAttempts:      cfg.MaxAttempts,
		ShutdownTimeout:  cfg.ShutdownTimeout,
		ReconnectMaxWait: cfg.ReconnectMaxWait,
		DatabaseCheck:    func(ctx context.Context) error { return database.Ping(ctx, db) },
		OnStage:          onStage,
	}, inbox.New(db, cfg.Consumer), payment.NewHandler(gw), cfg.HandlerTimeout, m, log)
}

// newPruner is the inbox retention: every replica runs it, one prunes at a time.
func newPruner(cfg config.PaymentService, db *gorm.DB, reg prometheus.Registerer, log *slog.Logger) (*retention.Pruner, error) {
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	return retention.New(sqlDB, retention.Config{
		Consumer:    cfg.Consumer,
		Window:      cfg.InboxRetention,
		BatchSize:   cfg.InboxPruneBatch,
		Pause:       retention.DefaultPause,
		Interval:    cfg.InboxPruneInterval,
		RetryDelays: cfg.RetryDelays,
		MaxAttempts: cfg.MaxAttempts,
	}, retention.NewMetrics(reg), log)
}

// serve runs the HTTP server, the consumer and the inbox pruner until ctx is
// cancelled or the server fails, then stops the consumer first (it waits for
// in-flight messages), the pruner (its batch in flight rolls back) and the
// server last, so readiness stays observable during the drain.
func serve(ctx context.Context, srv *http.Server, rt *consumer.Runtime, pruner *retention.Pruner, timeout time.Duration, log *slog.Logger) error {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", srv.Addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	rtErr := rt.Run(ctx)
	log.Info("consumer stopped; shutting down")
	cancel()
	pruning.Wait()
	shutdownCtx, done := context.WithTimeout(context.Background(), timeout)
	defer done()
	err = errors.Join(rtErr, srv.Shutdown(shutdownCtx), <-srvErr)
	if err == nil {
		log.Info("stopped cleanly")
	}
	return err
}

// localURL turns a listen address such as ":8080" into a URL on loopback.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
