// Command inboxctl operates the payment stack: the payment service's
// operations commands (the same every service on the kit carries, see
// kit.Operate: migrate, dlq, inbox), plus what belongs to this stack alone:
// the invariants report after a run (verify) and the fake gateway's schema.
//
//	inboxctl migrate [gateway]
//	inboxctl dlq list [--limit N] [--json]
//	inboxctl dlq replay (--id ID | --reason R | --all) [--dry-run] [--max-replays N] [--force]
//	inboxctl dlq purge [--yes]
//	inboxctl inbox prune|status|parked|retry|skip|export …
//	inboxctl outbox status|parked|retry …
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
	"strings"
	"syscall"

	"github.com/inbox-template/payment-service/internal/demo/config"
	"github.com/inbox-template/payment-service/internal/demo/fakegateway"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/kit"
)

const usage = `usage: inboxctl <command>

the payment stack's own commands:
  migrate gateway              apply the fake gateway's schema to
                               GATEWAY_DATABASE_URL
  verify (--summary FILE ... | --run-id ID --orders N) [--json]
                               check the invariants after a run: every order
                               paid once or dead-lettered, none charged twice,
                               queues drained; exit 1 if one is broken; reads
                               the service's configuration and
                               GATEWAY_DATABASE_URL

`

// serviceOnly is the head of kit.OperationsUsage: its title and the lines of what the
// service's own binary alone does (serve, healthcheck).
const serviceOnly = "commands:\n" +
	"  (none)                       serve: consume until SIGINT or SIGTERM\n" +
	"  healthcheck                  exit 0 if the local service is ready (/readyz)\n"

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
		_, err = io.WriteString(stdout, usage+strings.Replace(kit.OperationsUsage, serviceOnly, "the payment service's operations commands (payment-service has them too):\n", 1))
	}
	return kit.WithHelpHint(err, "inboxctl")
}

func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return &kit.UsageError{Err: errors.New("no command")}
	}
	switch {
	case args[0] == "verify":
		return verifyCmd(ctx, payment.Service(), args[1:], stdout)
	case args[0] == "migrate" && len(args) == 2 && args[1] == "gateway":
		var cfg config.Verify
		if err := config.Load(&cfg); err != nil {
			return err
		}
		return kit.MigrateDatabase(ctx, cfg.GatewayDatabaseURL, "fake-gateway", []kit.MigrationSet{fakegateway.Migrations}, stdout)
	}
	return kit.Operate(ctx, payment.Service(), args, stdin, stdout)
}
