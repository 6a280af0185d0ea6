// Command order-publisher publishes OrderPlaced events to RabbitMQ with
// publisher confirms, and duplicates, producer retries and poison messages on
// purpose, then prints what it sent. It exits 1 unless the broker confirmed
// every message and returned none.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/inbox-template/payment-service/internal/demo/config"
	"github.com/inbox-template/payment-service/internal/demo/producer"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "order-publisher:", err)
		os.Exit(1)
	}
}

// run publishes one load. Logs go to stderr, the summary to stdout, so that
// stdout stays readable and scripts can rely on -summary for the JSON.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	var cfg config.Publisher
	if err := config.Load(&cfg); err != nil {
		return err
	}
	log := logging.New(stderr, "info", "order-publisher")
	if opts.oncePath != "" {
		if _, err := os.Stat(opts.oncePath); err == nil {
			log.Info("published already: nothing to do", "once", opts.oncePath)
			return nil
		}
	}
	log.Info("starting", "config", config.LogValue(&cfg), "run_id", opts.load.RunID, "seed", opts.load.Seed,
		"count", opts.load.Count, "poison", opts.load.Poison)

	tracer, shutdown, err := tracing.Start(ctx, cfg.Config, tracing.Setup{Name: "order-publisher", Stdout: stderr, Log: log}) // stdout has the report
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	defer func() {
		if err := tracing.Shutdown(shutdown, tracing.FlushTimeout); err != nil {
			log.Warn("tracing", "err", err)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.timeout)
	defer cancel()
	sum, runErr := producer.Run(ctx, producer.Config{
		Broker: producer.Broker{
			URL:        cfg.AMQPURL,
			Exchange:   cfg.Exchange,
			RoutingKey: cfg.RoutingKey,
			Name:       "order-publisher " + opts.load.RunID,
		},
		Load:   opts.load,
		Rate:   opts.rate,
		Tracer: tracer,
	}, log)
	err = errors.Join(runErr, report(sum, stdout, opts.summaryPath))
	if kerr := keep(sum, cfg.SummaryDir); kerr != nil {
		// A directory this user may not write (a fault script's run as
		// another user) costs verify --run-id the figures, not the run.
		log.Warn("the summary is not kept for inboxctl verify --run-id", "err", kerr)
	}
	if err == nil && opts.oncePath != "" {
		// #nosec G306 -- a marker holding a run id, read by the next start
		if err := os.WriteFile(opts.oncePath, []byte(sum.RunID+"\n"), 0o644); err != nil {
			return fmt.Errorf("record the run in -once file: %w", err)
		}
	}
	return err
}

// keep writes the summary as JSON to dir/<run id>.json, for inboxctl verify
// --run-id (SUMMARY_DIR; "" keeps nothing).
func keep(sum producer.Summary, dir string) error {
	if dir == "" {
		return nil
	}
	// #nosec G301 -- shared on purpose: inboxctl verify, run as another user, reads the summaries
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("SUMMARY_DIR: %w", err)
	}
	return writeSummary(sum, filepath.Join(dir, sum.RunID+".json"))
}

// report prints the summary and, when asked, writes it as JSON to path.
func report(sum producer.Summary, stdout io.Writer, path string) error {
	if err := sum.WriteText(stdout); err != nil {
		return err
	}
	if path == "" {
		return nil
	}
	return writeSummary(sum, path)
}

// writeSummary writes the summary as JSON to path.
func writeSummary(sum producer.Summary, path string) error {
	// #nosec G304 -- the operator's -summary path
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create summary file: %w", err)
	}
	if err := sum.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close summary file: %w", err)
	}
	return nil
}
