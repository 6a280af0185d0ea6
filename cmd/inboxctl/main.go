// Command inboxctl operates the data of a service built on the kit: it applies
// the schema migrations (the same ones the service applies at start), lists,
// replays and purges the dead-letter queue, prunes the inbox on demand, and
// shows and repairs the buffered inbox (status, parked, retry, skip, export). It
// reads the service's own configuration (the same variables, the same
// defaults), so it finds the service's database, queues and retention.
//
//	inboxctl [--service NAME] <command>
//	inboxctl migrate [gateway]
//	inboxctl dlq list [--limit N] [--json]
//	inboxctl dlq replay (--id ID | --reason R | --all) [--dry-run] [--max-replays N] [--force]
//	inboxctl dlq purge [--yes]
//	inboxctl inbox prune [--older-than D] [--batch N] [--dry-run]
//	inboxctl inbox status [--json]
//	inboxctl inbox parked [--limit N] [--key K]
//	inboxctl inbox retry (--id ID | --key K | --all)
//	inboxctl inbox skip (--id ID | --key K)
//	inboxctl inbox export (--id ID | --key K | --all) [--dry-run]
//	inboxctl verify (--summary FILE ... | --run-id ID --orders N) [--json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/inbox-template/payment-service/examples/shipping"
	"github.com/inbox-template/payment-service/internal/config"
	"github.com/inbox-template/payment-service/internal/database"
	"github.com/inbox-template/payment-service/internal/logging"
	"github.com/inbox-template/payment-service/internal/migrations"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/internal/service"
)

const usage = `usage: inboxctl [--service NAME] <command>

--service chooses the service whose configuration is read (default
payment-service; also shipping-service, the example consumer).

commands:
  migrate                      apply the service's schemas (the inbox and the
                               buffered inbox, then its own) to DATABASE_URL
                               and print their versions
  migrate gateway              apply the fake gateway's schema to
                               GATEWAY_DATABASE_URL
  dlq list [--limit N] [--json]
                               show the first N (default 100) dead letters and
                               leave them in the dead-letter queue
  dlq replay (--id ID | --reason R | --all) [--dry-run] [--max-replays N] [--force]
                               move the chosen dead letters back to the work
                               queue with a fresh retry budget; a message
                               replayed N (default 3) times already is refused,
                               and so is one first published longer ago than
                               IDEMPOTENCY_KEY_TTL less its retries: the
                               services it calls may have forgotten its keys
                               and repeat its side effects. --force replays
                               those too: only when you know the side effect
                               did not happen
  dlq purge [--yes]            delete every dead letter; asks to type the
                               queue name unless --yes
  inbox prune [--older-than D] [--batch N] [--dry-run]
                               delete inbox rows older than D (default
                               INBOX_RETENTION) in batches of N (default
                               INBOX_PRUNE_BATCH) and print how long it took;
                               also the buffered inbox's finished messages
  inbox status [--json]        the buffered inbox (INBOX_MODE=buffered): counts
                               per status, the oldest unprocessed message's
                               age, the keys blocked by a parked head
  inbox parked [--limit N] [--key K]
                               list parked messages, longest parked first
  inbox retry (--id ID | --key K | --all)
                               give parked messages a fresh retry budget
  inbox skip (--id ID | --key K)
                               give up a parked message; its key goes on
  inbox export (--id ID | --key K | --all) [--dry-run]
                               move parked messages to the dead-letter queue
                               (then dlq list / replay); their keys go on
  verify (--summary FILE ... | --run-id ID --orders N) [--json]
                               check the invariants after a run: every order
                               paid once or dead-lettered, none charged twice,
                               queues drained; exit 1 if one is broken

Every command reads the service's configuration: dlq its broker and queues
(AMQP_URL, QUEUE, DEAD_LETTER_QUEUE, …) and the replay age limit
(IDEMPOTENCY_KEY_TTL, RETRY_DELAYS, MAX_ATTEMPTS, HANDLER_TIMEOUT), inbox prune its database and
retention (DATABASE_URL, CONSUMER_NAME, INBOX_RETENTION, INBOX_PRUNE_BATCH,
RETRY_DELAYS, MAX_ATTEMPTS), the buffered inbox's commands its database and
CONSUMER_NAME (export also its broker); verify, for the payment service only,
also reads GATEWAY_DATABASE_URL.
`

// services are the services built on the kit that inboxctl knows.
var services = map[string]func() service.Options{
	"payment-service":  payment.Service,
	"shipping-service": shipping.Service,
}

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
	opts, args, err := chooseService(args)
	if err == nil {
		err = dispatch(ctx, opts, args, stdin, stdout)
	}
	if errors.Is(err, flag.ErrHelp) {
		_, err = io.WriteString(stdout, usage)
	}
	return err
}

// chooseService reads the --service flag before the command.
func chooseService(args []string) (service.Options, []string, error) {
	fs := flag.NewFlagSet("inboxctl", flag.ContinueOnError)
	name := fs.String("service", "payment-service", "the service whose configuration is read")
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return service.Options{}, nil, err
		}
		return service.Options{}, nil, fmt.Errorf("%w\n%s", err, usage)
	}
	newOpts, ok := services[*name]
	if !ok {
		return service.Options{}, nil, fmt.Errorf("unknown service %q (want one of %v)", *name, slices.Sorted(maps.Keys(services)))
	}
	return newOpts(), fs.Args(), nil
}

func dispatch(ctx context.Context, opts service.Options, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("no command\n" + usage)
	}
	switch args[0] {
	case "migrate":
		return migrate(ctx, opts, args[1:], stdout)
	case "dlq":
		return dlq(ctx, opts, args[1:], stdin, stdout)
	case "inbox":
		return inbox(ctx, opts, args[1:], stdout)
	case "verify":
		if opts.Name != "payment-service" {
			return fmt.Errorf("verify checks the payment service's invariants, not %s's", opts.Name)
		}
		return verifyCmd(ctx, opts, args[1:], stdout)
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

func migrate(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	var url, name string
	var sets []migrations.Set
	switch {
	case len(args) == 0:
		cfg, err := service.LoadConfig(opts)
		if err != nil {
			return err
		}
		url, name, sets = cfg.URL, opts.Name, service.Schemas(opts)
	case len(args) == 1 && args[0] == "gateway":
		var cfg config.Verify
		if err := config.Load(&cfg); err != nil {
			return err
		}
		url, name, sets = cfg.GatewayDatabaseURL, "fake-gateway", []migrations.Set{migrations.Gateway}
	default:
		return fmt.Errorf("migrate: unexpected arguments %q (want none, or gateway)", args)
	}
	log := logging.New(io.Discard, "error", "inboxctl")
	db, err := database.Open(ctx, database.Options{URL: url, MaxConns: 2, StatementTimeout: 5 * time.Minute, AppName: "inboxctl"}, log)
	if err != nil {
		return err
	}
	defer database.Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	applied, err := migrations.Apply(ctx, sqlDB, sets...)
	if err != nil {
		return err
	}
	for _, set := range sets {
		version, err := migrations.Version(ctx, sqlDB, set)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %s schema at version %d (applied now: %v)\n", name, set.Name(), version, applied[set.Name()])
	}
	return nil
}
