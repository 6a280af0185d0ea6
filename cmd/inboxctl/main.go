// Command inboxctl operates the payment service's data: it applies the schema
// migrations (the same ones the service applies at start), lists, replays and
// purges the dead-letter queue, and prunes the inbox on demand.
//
//	inboxctl migrate [payments|gateway]
//	inboxctl dlq list [--limit N] [--json]
//	inboxctl dlq replay (--id ID | --reason R | --all) [--dry-run] [--max-replays N]
//	inboxctl dlq purge [--yes]
//	inboxctl inbox prune [--older-than D] [--batch N] [--dry-run]
//	inboxctl verify (--summary FILE ... | --run-id ID --orders N) [--json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/inbox-template/payment-service/internal/config"
	"github.com/inbox-template/payment-service/internal/database"
	"github.com/inbox-template/payment-service/internal/logging"
	"github.com/inbox-template/payment-service/internal/migrations"
)

const usage = `usage: inboxctl <command>

commands:
  migrate [payments|gateway]   apply the embedded migrations to DATABASE_URL
                               (default: payments) and print the schema version
  dlq list [--limit N] [--json]
                               show the first N (default 100) dead letters and
                               leave them in the dead-letter queue
  dlq replay (--id ID | --reason R | --all) [--dry-run] [--max-replays N]
                               move the chosen dead letters back to the work
                               queue with a fresh retry budget; a message
                               replayed N (default 3) times already is refused
  dlq purge [--yes]            delete every dead letter; asks to type the
                               queue name unless --yes
  inbox prune [--older-than D] [--batch N] [--dry-run]
                               delete inbox rows older than D (default
                               INBOX_RETENTION) in batches of N (default
                               INBOX_PRUNE_BATCH) and print how long it took
  verify (--summary FILE ... | --run-id ID --orders N) [--json]
                               check the invariants after a run: every order
                               paid once or dead-lettered, none charged twice,
                               queues drained; exit 1 if one is broken

dlq reads AMQP_URL, QUEUE and DEAD_LETTER_QUEUE; inbox prune reads DATABASE_URL,
CONSUMER_NAME, INBOX_RETENTION, INBOX_PRUNE_BATCH, RETRY_DELAYS and MAX_ATTEMPTS;
verify reads DATABASE_URL, GATEWAY_DATABASE_URL, AMQP_URL, QUEUE, DEAD_LETTER_QUEUE
and RETRY_DELAYS.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxctl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	err := dispatch(ctx, args, stdin, stdout)
	if errors.Is(err, flag.ErrHelp) {
		_, err = io.WriteString(stdout, usage)
	}
	return err
}

func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("no command\n" + usage)
	}
	switch args[0] {
	case "migrate":
		return migrate(ctx, args[1:], stdout)
	case "dlq":
		return dlq(ctx, args[1:], stdin, stdout)
	case "inbox":
		return inbox(ctx, args[1:], stdout)
	case "verify":
		return verifyCmd(ctx, args[1:], stdout)
	case "help", "-h", "--help":
		return flag.ErrHelp
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// parseFlags parses a subcommand's flags and allows no positional arguments.
// The flag package's own messages go nowhere: the error carries them.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%s: %w\n%s", fs.Name(), err, usage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q\n%s", fs.Name(), fs.Arg(0), usage)
	}
	return nil
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func migrate(ctx context.Context, args []string, stdout io.Writer) error {
	set, name := migrations.Payments, "payments"
	if len(args) > 0 {
		switch args[0] {
		case "payments":
		case "gateway":
			set, name = migrations.Gateway, "gateway"
		default:
			return fmt.Errorf("migrate: unknown schema %q (want payments or gateway)", args[0])
		}
	}
	var cfg config.Migrate
	if err := config.Load(&cfg); err != nil {
		return err
	}
	log := logging.New(io.Discard, "error", "inboxctl")
	db, err := database.Open(ctx, database.Options{URL: cfg.URL, MaxConns: 2, StatementTimeout: 5 * time.Minute, AppName: "inboxctl"}, log)
	if err != nil {
		return err
	}
	defer database.Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	applied, err := migrations.Apply(ctx, sqlDB, set)
	if err != nil {
		return err
	}
	version, err := migrations.Version(ctx, sqlDB, set)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s schema at version %d (applied now: %v)\n", name, version, applied)
	return err
}
