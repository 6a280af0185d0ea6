package kit

import (
	"context"
	"io"

	"github.com/inbox-template/payment-service/kit/internal/ops"
)

// Operate runs one of svc's operations commands, not the service: for an
// operator's program that carries a service's commands beside commands of
// its own (the payment stack's inboxctl). args[0] names the command (env,
// version, migrate, dlq, inbox, outbox); flag.ErrHelp asks for the usage
// (OperationsUsage), and a *UsageError says what is wrong with the command
// line. Run does the same for a service's own binary.
func Operate(ctx context.Context, svc Service, args []string, stdin io.Reader, stdout io.Writer) error {
	return ops.Command(ctx, svc, args, stdin, stdout)
}

// OperationsUsage is the usage of the operations commands, as a service's
// help prints it.
const OperationsUsage = ops.Usage

// UsageError is a command line the commands do not take: its text is the
// mistake, then, once Program is set, a line naming Program's help.
type UsageError = ops.UsageError

// WithHelpHint returns err with its hint naming program when err is a
// *UsageError, and err unchanged otherwise: a program with commands of its
// own names itself.
func WithHelpHint(err error, program string) error { return ops.WithHelpHint(err, program) }

// MigrateDatabase applies sets to the database at url under name (the
// advisory lock's and the log's) and prints their versions to stdout: for a
// tool that owns a schema of its own (the fake gateway's).
func MigrateDatabase(ctx context.Context, url, name string, sets []MigrationSet, stdout io.Writer) error {
	return ops.Migrate(ctx, url, name, sets, stdout)
}
