// Command inboxctl operates the payment service's data: it applies the schema
// migrations (the same ones the service applies at start).
//
//	inboxctl migrate [payments|gateway]
package main

import (
	"context"
	"errors"
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
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxctl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("no command\n" + usage)
	}
	switch args[0] {
	case "migrate":
		return migrate(ctx, args[1:], stdout)
	case "help", "-h", "--help":
		_, err := io.WriteString(stdout, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
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
