// Command fake-gateway serves the fake payment gateway: charges with real
// idempotency-key semantics over its own PostgreSQL database (or, for
// benchmarks, in memory: STORE=memory), and fault knobs.
//
//	fake-gateway              serve on HTTP_ADDR
//	fake-gateway healthcheck  exit 0 if the local server answers /healthz with 200
//
// The healthcheck form exists for Docker health checks in a distroless image,
// which has no shell and no curl.
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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inbox-template/payment-service/internal/demo/config"
	"github.com/inbox-template/payment-service/internal/demo/fakegateway"
	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/migrations"
)

const shutdownTimeout = 10 * time.Second

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fake-gateway:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.FakeGateway
	if err := config.Load(&cfg); err != nil {
		return err
	}
	switch {
	case len(args) == 0:
		return serve(ctx, cfg, stdout, stderr)
	case len(args) == 1 && args[0] == "healthcheck":
		return healthcheck(ctx, cfg.HTTPAddr)
	default:
		return fmt.Errorf("unknown arguments %q; usage: fake-gateway [healthcheck]", args)
	}
}

// serve runs the gateway until ctx ends or SIGINT or SIGTERM arrives.
func serve(ctx context.Context, cfg config.FakeGateway, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := newLogger(stdout, cfg.LogLevel)
	log.InfoContext(ctx, "starting", slog.Any("config", config.LogValue(&cfg)))

	store, closeStore, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeStore()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	faults := fakegateway.Faults{ErrorRate: cfg.ErrorRate, LostResponseRate: cfg.LostResponseRate, Latency: cfg.Latency, KeyTTL: cfg.KeyTTL}
	srv, err := fakegateway.NewServerWithStore(store, reg, log, faults, fakegateway.Options{
		InFlightTakeover: cfg.InFlightTakeover,
		FaultsEnabled:    cfg.FaultsEnabled,
		FaultsToken:      cfg.FaultsToken,
	})
	if err != nil {
		return fmt.Errorf("build gateway: %w", err)
	}
	return listen(ctx, log, stderr, cfg.HTTPAddr, srv.Handler())
}

// openStore opens the store STORE names, and returns what closes it.
func openStore(ctx context.Context, cfg config.FakeGateway, log *slog.Logger) (fakegateway.Store, func(), error) {
	if cfg.Store == config.GatewayStoreMemory {
		log.WarnContext(ctx, "charges are kept in memory: lost on exit, invisible to inboxctl verify")
		return fakegateway.NewMemoryStore(), func() {}, nil
	}
	db, err := database.Open(ctx, database.Options{
		URL: cfg.DatabaseURL, MaxConns: cfg.StoreMaxConns, StatementTimeout: 5 * time.Second, AppName: "fake-gateway",
	}, log)
	if err != nil {
		return nil, nil, err
	}
	closeDB := func() {
		if err := database.Close(db); err != nil {
			log.Warn("close database", slog.Any("error", err))
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("database handle: %w", err)
	}
	applied, err := migrations.Apply(ctx, sqlDB, fakegateway.Migrations)
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	log.InfoContext(ctx, "migrations applied", slog.Any("versions", applied))
	return fakegateway.NewPostgresStore(db), closeDB, nil
}

// listen serves h on addr until ctx ends, then drains requests for up to
// shutdownTimeout.
func listen(ctx context.Context, log *slog.Logger, stderr io.Writer, addr string, h http.Handler) error {
	hs := &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		// The latency fault may hold a request for up to a minute.
		WriteTimeout: 90 * time.Second,
		// Longer than the client's idle timeout, so that the client, not the
		// server, closes idle connections and never writes into a closing one.
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    slog.NewLogLogger(slog.NewJSONHandler(stderr, nil), slog.LevelWarn),
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(l) }()
	log.InfoContext(ctx, "listening", slog.String("addr", l.Addr().String()))

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", slog.String("timeout", shutdownTimeout.String()))
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		// Requests still running (the latency fault) are cut off; their clients retry.
		_ = hs.Close()
		<-serveErr
		return fmt.Errorf("shut down http: %w", err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	log.Info("stopped")
	return nil
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level)) // config.Load has validated it
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

// healthcheck asks the server on this host for /healthz.
func healthcheck(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR %q: %w", addr, err)
	}
	// A server on all interfaces (":8081") answers on the loopback address.
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, port) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %d", url, resp.StatusCode)
	}
	return nil
}
