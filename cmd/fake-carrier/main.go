// Command fake-carrier serves the demo pipeline's carrier: pickup bookings
// with real idempotency-key semantics over its own PostgreSQL database, and
// fault knobs (FAULT_* at start, POST /faults at run time). The shipping
// service books a pickup here for every paid order.
//
//	fake-carrier              serve on HTTP_ADDR
//	fake-carrier healthcheck  exit 0 if the local server answers /healthz with 200
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

	"github.com/inbox-template/payment-service/internal/demo/config"
	"github.com/inbox-template/payment-service/internal/demo/fakecarrier"
	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/health"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/migrations"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fake-carrier:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var cfg config.FakeCarrier
	if err := config.Load(&cfg); err != nil {
		return err
	}
	switch {
	case len(args) == 1 && args[0] == "healthcheck":
		return health.Probe(ctx, localURL(cfg.HTTPAddr)+"/healthz")
	case len(args) > 0:
		return fmt.Errorf("unknown arguments %q; usage: fake-carrier [healthcheck]", args)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := logging.New(stdout, cfg.LogLevel, "fake-carrier")
	log.Info("starting", "config", config.LogValue(&cfg))
	db, err := database.Open(ctx, database.Options{URL: cfg.DatabaseURL, MaxConns: 10, StatementTimeout: 5 * time.Second, AppName: "fake-carrier"}, log)
	if err != nil {
		return err
	}
	defer database.Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	if _, err := migrations.Apply(ctx, sqlDB, fakecarrier.Migrations); err != nil {
		return err
	}
	srv, err := fakecarrier.NewServer(sqlDB, fakecarrier.Faults{ErrorRate: cfg.ErrorRate, LostResponseRate: cfg.LostResponseRate, Latency: cfg.Latency},
		cfg.InFlightTakeover, log)
	if err != nil {
		return err
	}
	if cfg.FaultsEnabled {
		srv.WithFaultEndpoints(cfg.FaultsToken)
	}
	return listen(ctx, cfg.HTTPAddr, srv.Handler(), log)
}

// listen serves h on addr until ctx ends, then drains requests for up to 10s.
func listen(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	hs := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 90 * time.Second, IdleTimeout: 2 * time.Minute}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", addr, err)
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String())
	select {
	case err := <-served:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}

// localURL turns a listen address such as ":8082" into a URL on loopback.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
