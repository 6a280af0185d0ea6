// Package kittest is what a service's tests are written with, against the
// real RabbitMQ and PostgreSQL: the service built and run as a process, or
// run in the test process; a vhost and a database per test, removed after
// it; the broker and the database read the way a test reads them; the
// headers and reasons the kit writes on a dead letter. The servers come from
// AMQP_URL and DATABASE_URL (TEST_DATABASE_URL), or the local defaults.
//
//	var service = kittest.NewProgram("../../cmd/refund-service")
//
//	func TestMain(m *testing.M) { os.Exit(kittest.RunMain(m)) }
//
//	func TestRefunds(t *testing.T) {
//		amqpURL, dbURL := kittest.VHost(t), kittest.Postgres(t)
//		p := service.Start(t, "AMQP_URL="+amqpURL, "DATABASE_URL="+dbURL)
//		kittest.Publish(t, amqpURL, "payments", "refund.requested", …)
//		kittest.Eventually(t, time.Minute, "the refund recorded", func() (bool, error) { … })
//	}
//
// The fault scenarios for any service (a crash at each point, connections
// cut, the broker stopped) are kit/kittest/faultkit's. This package and
// faultkit are made of the kit's own test harness (kit/internal/testenv).
package kittest

import (
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/internal/servicetest"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/wire"
)

// Program is a main package of the module, built once per test binary and
// run as a process, as it runs in production.
type Program = testenv.Program

// Process is a running Program: its address (health, metrics), its logs, its
// metrics, and the faults it can be made to suffer (kill, crash points).
type Process = testenv.Process

// NewProgram names the main package pkg (a path relative to the test's
// directory, "../../cmd/refund-service"), built at its first Start.
func NewProgram(pkg string) *Program { return testenv.NewProgram(pkg) }

// RunMain runs the tests and then removes what the Programs built: a test
// binary's TestMain returns os.Exit(kittest.RunMain(m)).
func RunMain(m *testing.M) int { return testenv.RunMain(m) }

// Stack is a service run in the test process (Start): its runtime, its
// database and its broker, for tests that look inside.
type Stack = servicetest.Stack

// Events is a queue of the test's own bound to an exchange the service
// publishes to (Stack.Bind): what its outbox relay published.
type Events = servicetest.Events

// Variable is one environment variable a program reads: its name, its
// default and what it is for (the field's desc tag).
type Variable = service.Variable

// Describe lists the variables of a configuration struct (a Settings, a
// tool's configuration) in field order, with the defaults of their default
// tags: for a test that holds an .env.example to the programs. A Service's
// own are its Describe method's.
func Describe(spec any) []Variable { return service.Describe(spec) }

// Start runs the service in the test process against the test's own vhost
// and database (env sets its variables, "INBOX_MODE=buffered"), until the
// test ends.
func Start(t testing.TB, svc kit.Service, env ...string) *Stack {
	return servicetest.Start(t, svc, env...)
}

// CheckWrites runs msg through h as the runtime does: its body decoded by
// events (the Events the service was wired with in kit.Consume; a refusal
// is returned), Handle with no transaction open, then the writes twice on
// db, in a transaction that rolls back and in one that commits (the runtime
// may run them again when a batch-mate fails). It fails t when the two runs
// differ or give no outcome, and returns what the committed run gave. A
// handler of another event than events' does not compile.
func CheckWrites[E any](t testing.TB, db *gorm.DB, events kit.Events[E], h kit.Handler[E], msg kit.Message) (kit.Outcome, error) {
	t.Helper()
	decoded, err := consumer.Decode(events, msg)
	if err != nil {
		return "", err
	}
	return servicetest.CheckWrites(t, db, consumer.Typed(h), decoded)
}

// Outbox is svc's outbox as the service holds it (Deps.Outbox) under its
// default CONSUMER_NAME, for a handler built outside a running service:
// its Enqueue writes rows the service's relay publishes, to the exchanges
// svc.Publishes names. A service that publishes nothing has none (nil), as
// its handler's Deps.Outbox is nil.
func Outbox(svc kit.Service) *kit.Outbox {
	if len(svc.Publishes) == 0 {
		return nil
	}
	return outbox.New(svc.Name, svc.Publishes...)
}

// VHost makes a vhost of the test's own on the broker, removed after the
// test, and returns its AMQP URL.
func VHost(t testing.TB) string { return testenv.VHost(t) }

// Postgres makes a database of the test's own, dropped after the test, and
// returns its URL.
func Postgres(t testing.TB) string { return testenv.Postgres(t) }

// MigratedDB is a database of the test's own with sets applied (the kit's own,
// migrations.Inbox and the like, among them if the test needs them), open.
func MigratedDB(t testing.TB, sets ...kit.MigrationSet) (*gorm.DB, string) {
	return testenv.MigratedDB(t, sets...)
}

// Publish publishes msgs to exchange with the routing key, each confirmed by
// the broker.
func Publish(t testing.TB, amqpURL, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	testenv.Publish(t, amqpURL, exchange, key, msgs...)
}

// WithChannel runs f on a channel of its own to the broker at url.
func WithChannel(t testing.TB, url string, f func(*amqp.Channel) error) {
	t.Helper()
	testenv.WithChannel(t, url, f)
}

// QueueDepth is the number of messages ready in queue.
func QueueDepth(t testing.TB, url, queue string) int { return testenv.QueueDepth(t, url, queue) }

// Count runs a SELECT count(*) … on the database at dbURL.
func Count(t testing.TB, dbURL, sql string, args ...any) int {
	return testenv.Count(t, dbURL, sql, args...)
}

// Eventually polls cond until it holds or timeout passes: for asynchronous
// effects, never to assert on speed (the timeout is generous).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	testenv.Eventually(t, timeout, what, cond)
}

// Reaches waits until count reaches want for as long as it keeps rising, and
// fails when it stood still for stall: for a backlog of many effects.
func Reaches(t testing.TB, stall time.Duration, what string, want int, count func() (int, error)) {
	t.Helper()
	testenv.Reaches(t, stall, what, want, count)
}

// Logger is a logger that writes to the test's log.
func Logger(t testing.TB) *slog.Logger { return testenv.Logger(t) }

// Recorder stands for a test in the test of a check (CheckWrites, a fault
// scenario's Check): it keeps what the check reports with Errorf instead of
// failing.
type Recorder = testenv.Recorder

// LoadConfig reads the service's configuration and settings from the
// environment as it does at start, refusing a bad value with an error that
// names the variable.
func LoadConfig(svc kit.Service) (kit.Config, error) { return kit.LoadConfig(svc) }

// FreeAddr is a free 127.0.0.1:port for a program of the test to listen on
// (below the kernel's ephemeral range where it can).
func FreeAddr(t testing.TB) string { return testenv.FreeAddr(t) }

// Buffer is a goroutine-safe log store: an io.Writer for the output of a
// program that is still running.
type Buffer = testenv.Buffer

// Build builds the main packages pkgs (a pattern relative to the test's
// package: "../../cmd/...") into a directory cached across test runs, and
// returns it.
func Build(pkgs string) (string, error) { return testenv.Build(pkgs) }

// TestDeadline is a minute before go test's -timeout ends the test binary (a
// quarter of what is left, if that is less), if t knows it.
func TestDeadline(t testing.TB) (time.Time, bool) { return testenv.TestDeadline(t) }

// Queue is a queue of the tests' broker, as list_queues gives it.
type Queue = testenv.Queue

// Queues lists the queues of vhost on the tests' broker.
func Queues(t testing.TB, vhost string) []Queue { return testenv.Queues(t, vhost) }

// CloseConnections makes the tests' broker close every connection of vhost,
// giving reason.
func CloseConnections(t testing.TB, vhost, reason string) { testenv.CloseConnections(t, vhost, reason) }

// Ctl runs a rabbitmqctl command (CtlEnv) and fails the test if it fails.
func Ctl(t testing.TB, args ...string) string { return testenv.Ctl(t, args...) }

// The environment the servers of the tests come from.
const (
	// PostgresEnv is an admin URL of the tests' PostgreSQL (default
	// postgres://postgres@127.0.0.1:5432/postgres).
	PostgresEnv = testenv.PostgresEnv
	// CtlEnv is the command that runs rabbitmqctl (default rabbitmqctl).
	CtlEnv = testenv.CtlEnv
)

// Cluster is the local three-node RabbitMQ cluster of the cluster tests:
// its nodes' URLs, its queues, and nodes to kill and start.
type Cluster = testenv.Cluster

// NewSharedCluster is the local cluster for a test that kills nodes one
// round at a time (Cluster.Round) beside other such tests.
func NewSharedCluster(t testing.TB) *Cluster { return testenv.NewSharedCluster(t) }

// GroupCommitVars is the environment of a service that commits in groups
// (the kit's default), for a test that sets it whatever the test tier.
func GroupCommitVars() []string { return testenv.GroupCommitVars() }

// AssertModelMatchesTable fails unless model's GORM fields and the migrated
// table have the same columns with the same nullability.
func AssertModelMatchesTable(t testing.TB, db *gorm.DB, model any) {
	t.Helper()
	testenv.AssertModelMatchesTable(t, db, model)
}

// ParkBuffered parks a message of the buffered inbox of consumer as the
// runtime parks one (id, its ordering key, behind messages waiting after it,
// reason and detail), for a test of an operator's command.
func ParkBuffered(t testing.TB, db *gorm.DB, consumer, id, key string, behind int, reason, detail string) {
	t.Helper()
	testenv.ParkBuffered(t, db, consumer, id, key, behind, reason, detail)
}

// CrashExitCode is the exit status of a process ended by a crash point.
const CrashExitCode = faults.ExitCode

// The headers the kit writes on a dead letter, and the reasons it assigns
// itself (a service's own reasons are its kit.NewReason words).
const (
	HeaderDeadLetterReason = wire.HeaderDeadLetterReason
	HeaderDeadLetterError  = wire.HeaderDeadLetterError
	HeaderAttempt          = wire.HeaderAttempt
	ReasonRetriesExhausted = wire.ReasonRetriesExhausted
	ReasonPayloadMismatch  = wire.ReasonPayloadMismatch
)
