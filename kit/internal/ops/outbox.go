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

	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/internal/service"
)

// The outbox's commands: status, parked, retry, skip.

func outboxCommand(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErrorf("outbox: missing subcommand (status, parked, retry or skip)")
	}
	switch args[0] {
	case "status":
		return outboxStatus(ctx, opts, args[1:], stdout)
	case "parked":
		return outboxParked(ctx, opts, args[1:], stdout)
	case "retry":
		return outboxRetry(ctx, opts, args[1:], stdout)
	case "skip":
		return outboxSkip(ctx, opts, args[1:], stdout)
	}
	return usageErrorf("outbox: unknown subcommand %q (want status, parked, retry or skip)", args[0])
}

// withOutbox opens the service's database and runs f on its outbox.
func withOutbox(ctx context.Context, opts service.Options, f func(cfg service.Config, s *outbox.Store) error) error {
	return withDB(ctx, opts, func(cfg service.Config, db *gorm.DB) error {
		sqlDB, err := db.DB()
		if err != nil {
			return err
		}
		return f(cfg, outbox.NewStore(sqlDB, cfg.Consumer))
	})
}

func outboxStatus(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("outbox status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return withOutbox(ctx, opts, func(cfg service.Config, s *outbox.Store) error {
		st, err := s.Status(ctx)
		if err != nil {
			return fmt.Errorf("outbox status: %w", err)
		}
		var oldest time.Duration
		if !st.OldestPending.IsZero() {
			oldest = time.Since(st.OldestPending)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(map[string]any{"producer": cfg.Consumer, "pending": st.Pending, "parked": st.Parked,
				"oldest_pending_seconds": oldest.Seconds()})
		}
		fmt.Fprintf(stdout, "%s outbox: %d pending, %d parked; oldest pending %s\n", cfg.Consumer, st.Pending, st.Parked, orDash(ageOrEmpty(oldest)))
		return nil
	})
}

func ageOrEmpty(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return age(d)
}

func outboxParked(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("outbox parked", flag.ContinueOnError)
	limit := fs.Int("limit", 100, "show at most this many rows")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *limit < 1 {
		return fmt.Errorf("outbox parked: --limit must be at least 1, got %d", *limit)
	}
	return withOutbox(ctx, opts, func(cfg service.Config, s *outbox.Store) error {
		parked, err := s.ListParked(ctx, *limit)
		if err != nil {
			return fmt.Errorf("outbox parked: %w", err)
		}
		fmt.Fprintf(stdout, "%s outbox: %d parked rows shown (an ordered one blocks its key)\n", cfg.Consumer, len(parked))
		if len(parked) == 0 {
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEXCHANGE\tROUTING KEY\tORDERING KEY\tREASON\tATTEMPTS\tPARKED FOR\tLAST ERROR")
		for _, p := range parked {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", p.ID, orDash(p.Exchange), p.RoutingKey, orDash(p.OrderingKey),
				p.Reason, p.Attempts, age(time.Since(p.ParkedAt)), orDash(oneLine(p.LastError, 80)))
		}
		return tw.Flush()
	})
}

func outboxRetry(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("outbox retry", flag.ContinueOnError)
	id := fs.String("id", "", "retry the parked row with this id")
	all := fs.Bool("all", false, "retry every parked row")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*id == "") == !*all {
		return usageErrorf("outbox retry: give exactly one of --id or --all")
	}
	return withOutbox(ctx, opts, func(cfg service.Config, s *outbox.Store) error {
		n, err := s.Retry(ctx, *id)
		if err != nil {
			return fmt.Errorf("outbox retry: %w", err)
		}
		fmt.Fprintf(stdout, "%s outbox: %d parked rows pending again with a fresh budget\n", cfg.Consumer, n)
		if *id != "" && n == 0 {
			return fmt.Errorf("outbox retry: no parked row with id %q", *id)
		}
		return nil
	})
}

func outboxSkip(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("outbox skip", flag.ContinueOnError)
	id := fs.String("id", "", "give up the parked row with this id")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *id == "" {
		return usageErrorf("outbox skip: give --id")
	}
	return withOutbox(ctx, opts, func(cfg service.Config, s *outbox.Store) error {
		k, err := s.Skip(ctx, *id)
		if err != nil {
			return fmt.Errorf("outbox skip: %w", err)
		}
		// The row is gone from the table: this line is its only copy.
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(k); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s outbox: parked row %s given up and deleted (above, as it was)", cfg.Consumer, k.ID)
		if k.OrderingKey != "" {
			fmt.Fprintf(stdout, "; its key %q goes on", k.OrderingKey)
		}
		fmt.Fprintln(stdout)
		return nil
	})
}
