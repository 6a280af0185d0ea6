package consumer

import (
	"cmp"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrPaused is matched by every error that pauses consumption.
var ErrPaused = errors.New("dependency unavailable for every message")

// PauseError says a dependency fails for every message alike (a gateway
// answering 401 after a key rotation, a 404 from a wrong URL): the message is
// not at fault. The runtime puts the message back without spending an
// attempt, stops consuming (readiness fails with Cause), and resumes by itself
// after a backoff. After Config.MaxHolds such holds of one message, its next
// pause is taken for the message's own fault: it is dead-lettered (buffered:
// parked) with wire.ReasonHeldTooOften.
type PauseError struct {
	Cause Cause
	Err   error
}

// Cause names what a pause waits for: readiness shows it, and it is the cause
// label of consumer_pauses_total. Like a Reason, a short, stable snake_case
// word ("gateway_misconfigured"), declared once at package level with
// NewCause, which panics on a malformed word (see NewReason: at start, or
// the message dead-lettered invalid_reason when made at run time). The zero
// Cause is no cause; a pause with it pauses as CauseInvalid.
type Cause struct{ word }

// NewCause returns the pause cause named w. It panics if w is not a
// snake_case word (see NewReason). Call it in a package-level var.
func NewCause(w string) Cause { return Cause{mustWord("NewCause", "a pause cause", w)} }

func (e *PauseError) Error() string {
	if e.Err == nil {
		return cmp.Or(e.Cause.String(), causeInvalid.s)
	}
	return cmp.Or(e.Cause.String(), causeInvalid.s) + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PauseError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPaused) true.
func (e *PauseError) Is(target error) bool { return target == ErrPaused }

// Pause marks err as a fault of a dependency that fails for every message.
// The zero Cause pauses as CauseInvalid, a pause the service's code asked
// for all the same (it counts against MaxHolds).
func Pause(cause Cause, err error) error {
	return &PauseError{Cause: cause, Err: err}
}

// step is where in the flow of a message an error arose.
type step string

const (
	stepLookup  step = "inbox look-up"
	stepHandler step = "handler"
	stepCommit  step = "commit"
)

// stepError records the step of a failure: the runtime's own database steps
// take an error without an SQLSTATE (a dropped connection, a timeout) for the
// database's fault; from the handler it may be the outside call's as well as
// the handler's own read, and the database's check decides (see
// Runtime.infrastructure).
type stepError struct {
	step step
	err  error
}

func (e *stepError) Error() string { return string(e.step) + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func failedAt(s step, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{step: s, err: err}
}

// Pause causes the runtime reports: the kit compares its own copies, so
// these are for reading (a service's tests, its readiness checks).
var (
	// CauseDatabase: the database failed its check.
	CauseDatabase = causeDatabase
	// CauseFailing: PauseAfterFailures distinct messages failed in a row.
	CauseFailing = causeFailing
	// CauseInvalid: the service's code paused with the zero Cause.
	CauseInvalid = causeInvalid
)

var (
	causeDatabase = Cause{word{"database"}}
	causeFailing  = Cause{word{"handler_failing"}}
	causeInvalid  = Cause{word{"invalid_cause"}}
)

// pauseCause says whether a failure is the infrastructure's rather than the
// message's, and names it; the zero Cause means the message failed.
func pauseCause(err error) Cause {
	var pe *PauseError
	if errors.As(err, &pe) {
		if pe.Cause.isZero() {
			return causeInvalid
		}
		return pe.Cause
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		if infrastructureState(pg.Code) {
			return causeDatabase
		}
		return Cause{}
	}
	var se *stepError
	if errors.As(err, &se) && se.step != stepHandler && connectionFault(err) {
		return causeDatabase
	}
	return Cause{}
}

// infrastructureState reports whether an SQLSTATE is a fault of the database
// or of its configuration rather than of the data: every message would fail
// alike, so none should spend an attempt on it.
func infrastructureState(code string) bool {
	if code == "57014" { // query_canceled: one statement waited too long (see waited)
		return false
	}
	switch code[:2] {
	case "08", // connection exception
		"53", // insufficient resources: disk full, out of memory, too many connections
		"57", // operator intervention: admin shutdown, cannot connect now, query canceled (statement timeout)
		"58", // system error: I/O
		"28", // invalid authorization: a rotated password
		"3D": // the database does not exist
		return true
	}
	return handlerMayCauseState(code)
}

// handlerMayCauseState reports the SQLSTATEs of infrastructureState that a
// handler's own statement can also cause by itself (see handlerMayCause).
func handlerMayCauseState(code string) bool {
	switch code {
	case "25006", // read_only_sql_transaction: a standby after a failover, or a write through a Reader
		"42501", // insufficient_privilege: a revoked grant
		"42P01", // undefined_table: the schema is not migrated
		"42703": // undefined_column: likewise
		return true
	}
	return false
}

// waited reports a statement that failed by waiting: on a lock another
// transaction holds (lock_timeout, statement_timeout: a concurrent duplicate,
// an operator's long transaction), or on a serialization conflict or
// deadlock. Not the message's fault, and not a reason to stop the replica
// either: the message goes back without spending an attempt.
func waited(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch pg.Code {
	case "55P03", "57014", "40001", "40P01":
		return true
	}
	return false
}

// connectionFault reports an error that carries no answer from the database:
// the connection failed, was closed, or timed out.
func connectionFault(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &netErr), errors.As(err, &connectErr),
		errors.Is(err, driver.ErrBadConn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return true
	}
	return strings.Contains(err.Error(), "conn closed")
}

// errPausedSession ends a session so that consumption pauses.
type errPausedSession struct{ cause Cause }

func (e errPausedSession) Error() string { return fmt.Sprintf("paused: %s", e.cause) }
