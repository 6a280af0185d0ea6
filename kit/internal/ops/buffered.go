package ops

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/deadletter"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// The buffered inbox's commands: status, parked, retry, skip, export.

// withStore opens the service's database and runs f on its buffered inbox.
func withStore(ctx context.Context, opts service.Options, f func(cfg service.Config, s *buffered.Store) error) error {
	return withDB(ctx, opts, func(cfg service.Config, db *gorm.DB) error { return f(cfg, buffered.New(db, cfg.Consumer)) })
}

// withDB loads the service's configuration, opens its database and runs f.
func withDB(ctx context.Context, opts service.Options, f func(cfg service.Config, db *gorm.DB) error) error {
	cfg, err := service.LoadConfig(opts)
	if err != nil {
		return err
	}
	db, err := openDB(ctx, opts, cfg)
	if err != nil {
		return err
	}
	defer database.Close(db)
	return f(cfg, db)
}

// openDB opens a small pool of the service's database for one command.
func openDB(ctx context.Context, opts service.Options, cfg service.Config) (*gorm.DB, error) {
	log := logging.New(io.Discard, "error", opts.Name)
	return database.Open(ctx, database.Options{URL: cfg.URL, MaxConns: 2, StatementTimeout: cfg.StatementTimeout, AppName: opts.Name + " ops"}, log)
}

func inboxStatus(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inbox status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return withStore(ctx, opts, func(cfg service.Config, s *buffered.Store) error {
		st, err := s.Stats(ctx, true)
		if err != nil {
			return fmt.Errorf("inbox status: %w", err)
		}
		if *asJSON {
			return printStatusJSON(stdout, cfg, st)
		}
		return printStatus(stdout, cfg, st)
	})
}

func oldestAge(st buffered.Stats) time.Duration {
	if st.OldestUnfinished.IsZero() {
		return 0
	}
	return max(0, st.Now.Sub(st.OldestUnfinished))
}

func printStatus(w io.Writer, cfg service.Config, st buffered.Stats) error {
	fmt.Fprintf(w, "%s: buffered inbox (INBOX_MODE=%s)\n", cfg.Consumer, cfg.InboxMode)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, status := range buffered.Statuses {
		fmt.Fprintf(tw, "%s\t%d\t\n", status, st.Counts[status])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.OldestUnfinished.IsZero() {
		fmt.Fprintln(w, "oldest unprocessed: none")
	} else {
		fmt.Fprintf(w, "oldest unprocessed: %s old (received %s)\n", age(oldestAge(st)), st.OldestUnfinished.UTC().Format(time.RFC3339))
	}
	_, err := fmt.Fprintf(w, "blocked keys: %d (a parked head each; %d messages wait behind them)\n", st.BlockedKeys, st.BlockedMessages)
	return err
}

func printStatusJSON(w io.Writer, cfg service.Config, st buffered.Stats) error {
	counts := map[string]int64{}
	for _, status := range buffered.Statuses {
		counts[string(status)] = st.Counts[status]
	}
	out := struct {
		Consumer         string           `json:"consumer"`
		Mode             string           `json:"inbox_mode"`
		Counts           map[string]int64 `json:"counts"`
		OldestAgeSeconds float64          `json:"oldest_unprocessed_age_seconds"`
		BlockedKeys      int64            `json:"blocked_keys"`
		BlockedMessages  int64            `json:"blocked_messages"`
	}{cfg.Consumer, cfg.InboxMode, counts, oldestAge(st).Seconds(), st.BlockedKeys, st.BlockedMessages}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func inboxParked(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inbox parked", flag.ContinueOnError)
	limit := fs.Int("limit", 100, "show at most this many messages")
	key := fs.String("key", "", "only the parked head of this ordering key")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *limit < 1 {
		return fmt.Errorf("inbox parked: --limit must be at least 1, got %d", *limit)
	}
	return withStore(ctx, opts, func(cfg service.Config, s *buffered.Store) error {
		parked, err := s.ListParked(ctx, buffered.Selector{OrderingKey: *key}, *limit)
		if err != nil {
			return fmt.Errorf("inbox parked: %w", err)
		}
		fmt.Fprintf(stdout, "%s: %d parked messages shown (each blocks its ordering key)\n", cfg.Consumer, len(parked))
		if len(parked) == 0 {
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "MESSAGE ID\tROUTING KEY\tORDERING KEY\tREASON\tATTEMPTS\tWAITING\tPARKED FOR\tLAST ERROR")
		for _, p := range parked {
			_, routingKey, _ := rabbit.HeaderOrigin(p.Headers) // stored at ingest; none by v0.3.0
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", p.MessageID, orDash(routingKey), p.OrderingKey, orDash(p.Reason), p.Attempts,
				p.Waiting, age(time.Since(p.ParkedAt)), orDash(oneLine(p.LastError, 80)))
		}
		return tw.Flush()
	})
}

// selectorFlags declares --id, --key and (if all) --all.
func selectorFlags(fs *flag.FlagSet, sel *buffered.Selector, all bool) {
	fs.StringVar(&sel.MessageID, "id", "", "the parked message with this message id")
	fs.StringVar(&sel.OrderingKey, "key", "", "the parked head of this ordering key")
	if all {
		fs.BoolVar(&sel.All, "all", false, "every parked message")
	}
}

func inboxRetry(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inbox retry", flag.ContinueOnError)
	var sel buffered.Selector
	selectorFlags(fs, &sel, true)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if sel.Validate() != nil {
		return usageErrorf("inbox retry: give exactly one of --id, --key or --all")
	}
	return withStore(ctx, opts, func(cfg service.Config, s *buffered.Store) error {
		n, err := s.Retry(ctx, sel)
		if err != nil {
			return fmt.Errorf("inbox retry: %w", err)
		}
		_, err = fmt.Fprintf(stdout, "re-armed %d parked messages of %s with a fresh retry budget (BUFFER_MAX_ATTEMPTS=%d)\n",
			n, cfg.Consumer, cfg.BufferMaxAttempts)
		return err
	})
}

func inboxSkip(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inbox skip", flag.ContinueOnError)
	var sel buffered.Selector
	selectorFlags(fs, &sel, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if sel.Validate() != nil {
		return usageErrorf("inbox skip: give exactly one of --id or --key")
	}
	return withStore(ctx, opts, func(cfg service.Config, s *buffered.Store) error {
		n, err := s.Skip(ctx, sel)
		if err != nil {
			return fmt.Errorf("inbox skip: %w", err)
		}
		_, err = fmt.Fprintf(stdout, "skipped %d parked messages of %s: their keys go on with the next message\n", n, cfg.Consumer)
		return err
	})
}

func inboxExport(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("inbox export", flag.ContinueOnError)
	var sel buffered.Selector
	selectorFlags(fs, &sel, true)
	dryRun := fs.Bool("dry-run", false, "show what would be exported; change nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if sel.Validate() != nil {
		return usageErrorf("inbox export: give exactly one of --id, --key or --all")
	}
	return withStore(ctx, opts, func(cfg service.Config, s *buffered.Store) error {
		return withQueue(opts, func(q *deadletter.Queue, _ ageLimit) error {
			rep, err := q.Export(ctx, s, sel, *dryRun)
			verb := "exported"
			if *dryRun {
				verb = "would export"
			}
			for _, p := range rep.Exported {
				fmt.Fprintf(stdout, "%s %s (key %s, reason %s) to %s\n", verb, p.MessageID, p.OrderingKey, orDash(p.Reason), q.Name())
			}
			if rep.Stale > 0 {
				fmt.Fprintf(stdout, "%d copies were published although their message was retried or skipped meanwhile: replaying them is a duplicate\n", rep.Stale)
			}
			if err != nil {
				return fmt.Errorf("inbox export: %w", err)
			}
			return nil
		})
	})
}
