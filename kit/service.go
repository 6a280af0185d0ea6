package kit

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/ops"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Service describes a service to the kit: its name and the event it
// consumes (every queue name derives from them), its exchange and binding
// key, its migrations, what it requires and publishes. Consume adds its
// events and handler.
type Service = service.Options

// Deps is what the kit gives a handler's constructor: the configuration, a
// reader for reads outside the transaction, the outbox, the tracer and the
// crash points.
type Deps = service.Kit

// Requirements are what a service's code needs of its configuration, checked
// at start: the inbox mode (ModeBuffered for order per key) and a single
// active consumer.
type Requirements = service.Requirements

// The inbox modes (INBOX_MODE).
const (
	// ModeInline processes each message as its delivery waits.
	ModeInline = service.ModeInline
	// ModeBuffered stores and acks each message at once, then processes a
	// key's messages in order from the table.
	ModeBuffered = service.ModeBuffered
)

// Consume returns svc with its events and its handler, both of the event
// type E: a handler of another type does not compile. newHandler runs once,
// at start.
func Consume[E any, H Handler[E]](svc Service, events Events[E], newHandler func(d *Deps) (H, error)) Service {
	return service.Consume(svc, events, newHandler)
}

// ConsumeWithSettings is Consume for a service with settings of its own: S
// is a struct read from the environment (envconfig tags), whose pointer may
// have a method Check(*Config, *Checks) that refuses bad values at start,
// naming the variable.
func ConsumeWithSettings[E, S any, H Handler[E]](svc Service, events Events[E], newHandler func(d *Deps, s *S) (H, error)) Service {
	return service.ConsumeWithSettings(svc, events, newHandler)
}

// Binding is an exchange and a binding key (a topic pattern: "*" one word,
// "#" any) a further event is consumed with (ConsumeAlso); an empty
// Exchange is the service's own.
type Binding = rabbit.Binding

// ConsumeAlso returns svc, wired by Consume or ConsumeWithSettings, with a
// further event: the messages published to binding's exchange (svc's own if
// it names none; the kit declares it) with a routing key its Key matches
// are decoded by events and handled by the handler newHandler builds, in
// the same inbox, outbox, database and queues; the work queue is bound once
// more, with binding. Each message goes to the first event bound to the
// exchange and key it was published with (a retried copy keeps them), svc's
// own first; one that none matches is dead-lettered (parked) invalid_event.
// The inbox is one dedupe namespace: message ids, and the ids the events'
// ID give, must be unique across the events. In the buffered mode the
// events' ordering keys share one order.
func ConsumeAlso[E any, H Handler[E]](svc Service, binding Binding, events Events[E], newHandler func(d *Deps) (H, error)) Service {
	return service.ConsumeAlso(svc, binding, events, newHandler)
}

// ConsumeAlsoWithSettings is ConsumeAlso for a handler that takes the
// service's settings S: svc was wired by ConsumeWithSettings with the same S.
func ConsumeAlsoWithSettings[E, S any, H Handler[E]](svc Service, binding Binding, events Events[E], newHandler func(d *Deps, s *S) (H, error)) Service {
	return service.ConsumeAlsoWithSettings(svc, binding, events, newHandler)
}

// Config is the kit's configuration of a service, as its environment set it.
type Config = service.Config

// Checks collects what a settings' Check finds wrong, each naming its
// variable.
type Checks = service.Checks

// JSONAttrs returns a Service.LogAttrs that puts the top-level string fields
// names of a JSON body (an order id) on every log line about a message.
func JSONAttrs(names ...string) func(body []byte) []slog.Attr { return service.JSONAttrs(names...) }

// Run runs the service with no arguments (until ctx ends: the main cancels it
// on SIGTERM or SIGINT), or the operations command args name (env, version,
// migrate, dlq, inbox, outbox, healthcheck; help lists them).
func Run(ctx context.Context, svc Service, args []string, stdin io.Reader, stdout io.Writer) error {
	return ops.Run(ctx, svc, args, stdin, stdout)
}

// MigrationSet is a service's own schema: versioned SQL files, applied at
// start after the kit's, under their own version table.
type MigrationSet = migrations.Set

// Migrations returns the migration set name of the .sql files in dir of fsys
// (an embed.FS); a dir that is not there panics, at start.
func Migrations(name string, fsys fs.FS, dir string) MigrationSet {
	if st, err := fs.Stat(fsys, dir); err != nil {
		panic(fmt.Sprintf("kit.Migrations(%q, …, %q): no directory %s in the files given: %v", name, dir, dir, err))
	} else if !st.IsDir() {
		panic(fmt.Sprintf("kit.Migrations(%q, …, %q): %s is a file, not a directory", name, dir, dir))
	}
	return migrations.NewSet(name, migrations.Must(fsys, dir))
}

// Reader runs a handler's reads outside its writes (Deps.Reader), on
// sessions PostgreSQL keeps read-only.
type Reader = database.Reader

// Task is a background task of a service (Service.Tasks).
type Task = service.Task

// Outbox emits events from a handler's writes: Enqueue in the inbox
// transaction, published by the relay once committed and confirmed by the
// broker (Deps.Outbox; Service.Publishes names the exchanges).
type Outbox = outbox.Outbox

// OutboxMessage is an event to emit through the Outbox.
type OutboxMessage = outbox.Message
