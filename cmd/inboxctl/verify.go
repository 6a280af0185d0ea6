package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/config"
	"github.com/inbox-template/payment-service/internal/database"
	"github.com/inbox-template/payment-service/internal/logging"
	"github.com/inbox-template/payment-service/internal/rabbit"
	"github.com/inbox-template/payment-service/internal/service"
	"github.com/inbox-template/payment-service/internal/verify"
)

// errInvariant makes the exit code 1 after the report was printed.
var errInvariant = errors.New("an invariant is broken")

// summaryFiles collects repeated --summary flags.
type summaryFiles []string

func (s *summaryFiles) String() string     { return fmt.Sprint(*s) }
func (s *summaryFiles) Set(v string) error { *s = append(*s, v); return nil }

func verifyCmd(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	var files summaryFiles
	fs.Var(&files, "summary", "order-publisher `summary` JSON file (repeatable)")
	runID := fs.String("run-id", "", "run id, instead of a summary (with --orders)")
	orders := fs.Int("orders", 0, "orders published by --run-id")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runs, err := loadRuns(files, *runID, *orders)
	if err != nil {
		return err
	}
	cfg, err := service.LoadConfig(opts)
	if err != nil {
		return err
	}
	var gw config.Verify
	if err := config.Load(&gw); err != nil {
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

func loadRuns(files []string, runID string, orders int) ([]verify.Run, error) {
	if runID != "" {
		if orders < 1 {
			return nil, errors.New("verify: --run-id needs --orders")
		}
		return []verify.Run{{RunID: runID, Orders: orders, Published: orders}}, nil
	}
	if len(files) == 0 {
		return nil, errors.New("verify: give --summary FILE (from order-publisher -summary) or --run-id with --orders")
	}
	runs := make([]verify.Run, 0, len(files))
	for _, f := range files {
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

func verifyRuns(ctx context.Context, opts service.Options, cfg service.Config, gwCfg config.Verify, runs []verify.Run) (verify.Report, error) {
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
	topo := service.Topology(cfg)
	src := verify.Sources{Payments: payments, Gateway: gw, Broker: verify.NewBroker(conn, topo, opts.LogAttrs), Topology: topo}
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
