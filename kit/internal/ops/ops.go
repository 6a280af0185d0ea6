// Package ops holds the operations commands that every service built on the
// kit carries in its own binary: env, version, migrate, dlq list|replay|purge, inbox
// prune|status|parked|retry|skip|export and outbox status|parked|retry|skip. They
// read the service's own configuration (the same variables and defaults as
// the running service), so they find its database, queues and retention:
//
//	shipping-service dlq list
//	payment-service inbox prune --dry-run
//
// A service's main calls Run: with no arguments it serves, with a command it
// runs that command. inboxctl is the payment service's commands plus the
// payment stack's own (verify, the gateway's schema).
package ops

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"runtime/debug"
	"strings"

	"github.com/inbox-template/payment-service/kit/internal/release"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// Usage lists the commands; SERVICE stands for the program's name.
const Usage = `commands:
  (none)                       serve: consume until SIGINT or SIGTERM
  healthcheck                  exit 0 if the local service is ready (/readyz)
  env                          print every variable the service reads, each
                               with its description and default, as a .env
                               file (NAME=default)
  version                      print the kit's release and the module
                               version the binary was built from
  migrate                      apply the service's schemas (the inbox and the
                               buffered inbox, then its own) to DATABASE_URL
                               and print their versions
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
                               did not happen. An --id not in the queue is an
                               error (exit 1)
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
  outbox status [--json]       the outbox: rows pending (committed, not yet
                               confirmed by the broker) and parked, the
                               oldest pending row's age
  outbox parked [--limit N]    list parked rows (publishes the broker returned
                               or refused OUTBOX_MAX_ATTEMPTS times), longest
                               parked first
  outbox retry (--id ID | --all)
                               make parked rows pending again with a fresh
                               budget (bind the missing queue first)
  outbox skip --id ID          give up a parked row (one that can never be
                               published: invalid): it is printed as JSON and
                               deleted; its key goes on

Every command reads the service's configuration: dlq its broker and queues
(AMQP_URL, QUEUE, DEAD_LETTER_QUEUE, …) and the replay age limit
(IDEMPOTENCY_KEY_TTL, RETRY_DELAYS, MAX_ATTEMPTS, HANDLER_TIMEOUT), inbox prune
its database and retention (DATABASE_URL, CONSUMER_NAME, INBOX_RETENTION,
INBOX_PRUNE_BATCH, RETRY_DELAYS, MAX_ATTEMPTS), the buffered inbox's commands
its database and CONSUMER_NAME (export also its broker), the outbox's its
database and CONSUMER_NAME.
`

// Run runs the service (no arguments, or healthcheck) or one of its commands.
// A command line it does not take is refused with the mistake and a line
// naming `<service> help`, which prints the usage.
func Run(ctx context.Context, opts service.Options, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 || len(args) == 1 && args[0] == "healthcheck" {
		return service.Run(ctx, opts, args, stdout)
	}
	err := Command(ctx, opts, args, stdin, stdout)
	if errors.Is(err, flag.ErrHelp) {
		_, err = fmt.Fprintf(stdout, "usage: %s [command]\n\n%s", opts.Name, Usage)
	}
	return WithHelpHint(err, opts.Name)
}

// UsageError is a command line the commands do not take. Its text is the
// mistake, then, once a program is named, a line that points to its help:
// the whole usage, some fifty lines, would bury the mistake.
type UsageError struct {
	Err error
	// Program names the help command of the hint; "" leaves the hint out.
	Program string
}

func (e *UsageError) Error() string {
	if e.Program == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("%v\nrun '%s help' for usage", e.Err, e.Program)
}

func (e *UsageError) Unwrap() error { return e.Err }

// usageErrorf is a UsageError with the text of fmt.Errorf.
func usageErrorf(format string, a ...any) error {
	return &UsageError{Err: fmt.Errorf(format, a...)}
}

// WithHelpHint returns err with its hint naming program when err is a
// UsageError, and err unchanged otherwise: a program with commands of its
// own (inboxctl) names itself.
func WithHelpHint(err error, program string) error {
	var ue *UsageError
	if !errors.As(err, &ue) {
		return err
	}
	return &UsageError{Err: ue.Err, Program: program}
}

// ErrUnknown is matched by the error of a command that is not one of these:
// a program with commands of its own tries them first.
var ErrUnknown = errors.New("unknown command")

// Command runs one command of the service's; flag.ErrHelp asks for the usage,
// and a *UsageError says what is wrong with the command line.
func Command(ctx context.Context, opts service.Options, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErrorf("no command")
	}
	switch args[0] {
	case "env":
		if len(args) > 1 {
			return usageErrorf("env: unexpected arguments %q", args[1:])
		}
		return env(opts, stdout)
	case "version":
		if len(args) > 1 {
			return usageErrorf("version: unexpected arguments %q", args[1:])
		}
		_, err := fmt.Fprintln(stdout, version(opts.Name))
		return err
	case "migrate":
		if len(args) > 1 {
			return usageErrorf("migrate: unexpected arguments %q", args[1:])
		}
		return migrate(ctx, opts, stdout)
	case "dlq":
		return dlq(ctx, opts, args[1:], stdin, stdout)
	case "inbox":
		return inbox(ctx, opts, args[1:], stdout)
	case "outbox":
		return outboxCommand(ctx, opts, args[1:], stdout)
	case "help", "-h", "--help":
		return flag.ErrHelp
	}
	return usageErrorf("%w %q", ErrUnknown, args[0])
}

// env prints the service's variables as a .env file: a comment with the
// description above each NAME=default.
func env(opts service.Options, stdout io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Every variable %s reads, set to its default (%s env).\n", opts.Name, opts.Name)
	for _, v := range opts.Describe() {
		if v.Name == "IDEMPOTENCY_KEY_TTL" && opts.NoOutsideCalls {
			continue // a service with no outside calls refuses it
		}
		if strings.HasPrefix(v.Name, "OUTBOX_") && len(opts.Publishes) == 0 {
			continue // no relay runs for a service that publishes nothing
		}
		fmt.Fprintf(&b, "\n# %s\n%s=%s\n", v.Desc, v.Name, v.Default)
	}
	_, err := io.WriteString(stdout, b.String())
	return err
}

// kitModule is the kit's module path: this package's, without /internal/ops (a copy
// of the template renames the module, and this follows).
var kitModule = strings.TrimSuffix(reflect.TypeFor[UsageError]().PkgPath(), "/internal/ops")

// version says which kit the binary holds: the release its source declares
// (release.Version) and the module version go build took it at, from the
// binary's build information: "v0.3.0" after go get …/kit@v0.3.0, a local
// directory where go.mod replaces the kit (the template's own services).
func version(program string) string {
	built := "unknown: no build information"
	if info, ok := debug.ReadBuildInfo(); ok {
		built = "not a dependency (the kit's own test binary)"
		for _, m := range info.Deps {
			if m.Path != kitModule {
				continue
			}
			built = m.Version
			if m.Replace != nil {
				built = fmt.Sprintf("%s, replaced by %s", m.Version, m.Replace.Path)
				if v := m.Replace.Version; v != "" && v != "(devel)" {
					built += " " + v
				}
			}
		}
	}
	return fmt.Sprintf("%s: kit %s (module %s %s)", program, release.Version, kitModule, built)
}

// parseFlags parses a subcommand's flags and allows no positional arguments.
// The flag package's own messages go nowhere: the error carries them.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageErrorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return usageErrorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// migrate applies the service's schemas to its database.
func migrate(ctx context.Context, opts service.Options, stdout io.Writer) error {
	cfg, err := service.LoadConfig(opts)
	if err != nil {
		return err
	}
	return Migrate(ctx, cfg.URL, opts.Name, service.Schemas(opts), stdout)
}

// Migrate applies sets to the database at url and prints their versions.
func Migrate(ctx context.Context, url, name string, sets []migrations.Set, stdout io.Writer) error {
	log := logging.New(io.Discard, "error", name)
	applied, versions, err := service.Migrate(ctx, url, name, sets, log)
	if err != nil {
		return err
	}
	for _, set := range sets {
		fmt.Fprintf(stdout, "%s: %s schema at version %d (applied now: %v)\n", name, set.Name(), versions[set.Name()], applied[set.Name()])
	}
	return nil
}
