package ops

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/retention"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/logging"
)

func inbox(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErrorf("inbox: missing subcommand (prune, status, parked, retry, skip or export)")
	}
	switch args[0] {
	case "prune":
		return inboxPrune(ctx, opts, args[1:], stdout)
	case "status":
		return inboxStatus(ctx, opts, args[1:], stdout)
	case "parked":
		return inboxParked(ctx, opts, args[1:], stdout)
	case "retry":
		return inboxRetry(ctx, opts, args[1:], stdout)
	case "skip":
		return inboxSkip(ctx, opts, args[1:], stdout)
	case "export":
		return inboxExport(ctx, opts, args[1:], stdout)
	}
	return usageErrorf("inbox: unknown subcommand %q (want prune, status, parked, retry, skip or export)", args[0])
}

// inboxPrune runs the service's scheduled prune once, now: the same code,
// lock and window rule, with the window and batch size overridable by flags.
func inboxPrune(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inbox prune", flag.ContinueOnError)
	olderThan := fs.Duration("older-than", retention.DefaultWindow, "delete rows received longer ago than this (default INBOX_RETENTION)")
	batch := fs.Int("batch", retention.DefaultBatchSize, "rows per transaction (default INBOX_PRUNE_BATCH)")
	dryRun := fs.Bool("dry-run", false, "count the rows that would be deleted; delete nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := service.LoadConfig(opts)
	if err != nil {
		return err
	}
	rc, err := pruneConfig(fs, cfg, *olderThan, *batch)
	if err != nil {
		return err
	}
	db, err := openDB(ctx, opts, cfg)
	if err != nil {
		return err
	}
	defer database.Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	p, err := retention.New(sqlDB, rc, retention.NewMetrics(prometheus.NewRegistry()), logging.New(io.Discard, "error", opts.Name))
	if err != nil {
		return err
	}
	if *dryRun {
		return pruneDryRun(ctx, p, rc, stdout)
	}
	return prune(ctx, p, rc, stdout)
}

// pruneConfig is the environment's retention settings with the flags given on
// the command line applied; a bad flag is named as the flag.
func pruneConfig(fs *flag.FlagSet, cfg service.Config, olderThan time.Duration, batch int) (retention.Config, error) {
	rc := service.PruneConfig(cfg)
	rc.Interval = 0 // one run, now
	if isSet(fs, "older-than") {
		rc.Window = olderThan
		if floor := retention.MinWindow(rc.RetryDelays, rc.MaxAttempts); olderThan < floor {
			return rc, fmt.Errorf("inbox prune: --older-than %s is below %s, the redelivery horizon of RETRY_DELAYS and MAX_ATTEMPTS (%s): %w",
				olderThan, floor, retention.MinWindowRule, retention.ErrWindowTooShort)
		}
	}
	if isSet(fs, "batch") {
		rc.BatchSize = batch
		if batch < 1 || batch > retention.MaxBatchSize {
			return rc, fmt.Errorf("inbox prune: --batch must be between 1 and %d, got %d", retention.MaxBatchSize, batch)
		}
	}
	return rc, rc.Validate()
}

func pruneDryRun(ctx context.Context, p *retention.Pruner, rc retention.Config, stdout io.Writer) error {
	n, err := p.Pending(ctx)
	if err != nil {
		return fmt.Errorf("inbox prune: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "would delete %d inbox rows of consumer %s received before %s (older than %s); dry run: nothing deleted\n",
		n.Rows, rc.Consumer, n.Cutoff.UTC().Format(time.RFC3339), rc.Window)
	if err == nil && rc.Buffered {
		_, err = fmt.Fprintf(stdout, "would delete %d finished messages of the buffered inbox (and the ordering keys they leave idle)\n", n.Messages)
	}
	return err
}

func prune(ctx context.Context, p *retention.Pruner, rc retention.Config, stdout io.Writer) error {
	res, err := p.Prune(ctx)
	if err != nil {
		return fmt.Errorf("inbox prune: %d rows deleted before: %w", res.Deleted, err)
	}
	if res.Skipped {
		return errors.New("inbox prune: another prune run (a service replica?) holds the lock; nothing deleted, try again later")
	}
	_, err = fmt.Fprintf(stdout, "deleted %d inbox rows of consumer %s received before %s in %d batches of up to %d; took %s, longest batch %s\n",
		res.Deleted, rc.Consumer, res.Cutoff.UTC().Format(time.RFC3339), res.Batches, rc.BatchSize,
		res.Elapsed.Round(time.Millisecond), res.LongestBatch.Round(time.Microsecond))
	if err == nil && res.DeletedMessages+res.DeletedKeys > 0 {
		_, err = fmt.Fprintf(stdout, "deleted %d finished messages and %d idle ordering keys of the buffered inbox\n", res.DeletedMessages, res.DeletedKeys)
	}
	return err
}
