package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/demo/config"
	"github.com/inbox-template/payment-service/internal/demo/verify"
	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// errInvariant makes the exit code 1 after the report was printed.
var errInvariant = errors.New("an invariant is broken")

// summaryFiles collects repeated --summary flags.
type summaryFiles []string

func (s *summaryFiles) String() string     { return fmt.Sprint(*s) }
func (s *summaryFiles) Set(v string) error { *s = append(*s, v); return nil }

func verifyCmd(ctx context.Context, opts kit.Service, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	var files summaryFiles
	fs.Var(&files, "summary", "order-publisher `summary` JSON file (repeatable)")
	runID := fs.String("run-id", "", "run id, instead of a summary (with --orders)")
	orders := fs.Int("orders", 0, "orders published by --run-id")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fs.SetOutput(io.Discard) // the error says it, and help prints the usage
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &kit.UsageError{Err: fmt.Errorf("verify: %w", err)}
	}
	if fs.NArg() > 0 {
		return &kit.UsageError{Err: fmt.Errorf("verify: unexpected argument %q", fs.Arg(0))}
	}
	cfg, err := kit.LoadConfig(opts)
	if err != nil {
		return err
	}
	var gw config.Verify
	if err := config.Load(&gw); err != nil {
		return err
	}
	runs, err := loadRuns(files, *runID, *orders, gw.SummaryDir, os.Stderr)
	if err != nil {
		return err
	}
	report, err := verifyRuns(ctx, opts, cfg, gw, runs)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(report)
	} else {
		err = report.Print(stdout)
	}
	if err == nil && !report.OK {
		err = errInvariant
	}
	return err
}

// loadRuns reads the summaries given, or the one of --run-id that the
// publisher left in dir (SUMMARY_DIR). Without it, a run is known by its id
// and --orders alone: what else it sent (duplicates, republishes, poison)
// counts as nothing, and stderr says so.
func loadRuns(files []string, runID string, orders int, dir string, stderr io.Writer) ([]verify.Run, error) {
	if runID != "" {
		if dir != "" {
			path := filepath.Join(dir, runID+".json")
			if _, err := os.Stat(path); err == nil {
				runs, err := loadRuns([]string{path}, "", 0, "", stderr)
				if err == nil && orders > 0 && runs[0].Orders != orders {
					err = fmt.Errorf("verify: --orders %d, but run %s published %d orders (%s)", orders, runID, runs[0].Orders, path)
				}
				return runs, err
			}
		}
		if orders < 1 {
			return nil, errors.New("verify: --run-id needs --orders when SUMMARY_DIR holds no summary of the run")
		}
		fmt.Fprintf(stderr, "verify: no summary of run %s in SUMMARY_DIR (%q): the duplicates, republishes and poison it sent count as none\n", runID, dir)
		return []verify.Run{{RunID: runID, Orders: orders, Published: orders}}, nil
	}
	if len(files) == 0 {
		return nil, errors.New("verify: give --summary FILE (from order-publisher -summary) or --run-id with --orders")
	}
	runs := make([]verify.Run, 0, len(files))
	for _, f := range files {
		// #nosec G304 -- the operator's own SUMMARY_DIR; inboxctl runs with the operator's rights
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		var r verify.Run
		if err := json.Unmarshal(raw, &r); err != nil || r.RunID == "" {
			return nil, fmt.Errorf("verify: %s is not an order-publisher summary: %v", f, err)
		}
		runs = append(runs, r)
	}
	return runs, nil
}

func verifyRuns(ctx context.Context, opts kit.Service, cfg kit.Config, gwCfg config.Verify, runs []verify.Run) (verify.Report, error) {
	log := logging.New(io.Discard, "error", "inboxctl")
	open := func(url string) (*gorm.DB, error) {
		return database.Open(ctx, database.Options{URL: url, MaxConns: 2, StatementTimeout: time.Minute, AppName: "inboxctl"}, log)
	}
	payments, err := open(cfg.URL)
	if err != nil {
		return verify.Report{}, err
	}
	defer database.Close(payments)
	gw, err := open(gwCfg.GatewayDatabaseURL)
	if err != nil {
		return verify.Report{}, fmt.Errorf("gateway database: %w", err)
	}
	defer database.Close(gw)
	conn, err := rabbit.Dial(cfg.AMQPURL, cfg.Heartbeat, "inboxctl verify")
	if err != nil {
		return verify.Report{}, err
	}
	defer conn.Close()
	topo := cfg.Topology()
	src := verify.Sources{Payments: payments, Gateway: gw, Broker: verify.NewBroker(conn, opts, topo.DeadLetterQueue), Topology: topo}
	if gwCfg.ShippingDatabaseURL != "" {
		shipping, err := open(gwCfg.ShippingDatabaseURL)
		if err != nil {
			return verify.Report{}, fmt.Errorf("shipping database: %w", err)
		}
		defer database.Close(shipping)
		carrier, err := open(gwCfg.CarrierDatabaseURL)
		if err != nil {
			return verify.Report{}, fmt.Errorf("carrier database: %w", err)
		}
		defer database.Close(carrier)
		src.Pipeline = &verify.Pipeline{Shipping: shipping, Carrier: carrier, Producer: cfg.Consumer}
	}
	return verify.Verify(ctx, src, runs)
}
