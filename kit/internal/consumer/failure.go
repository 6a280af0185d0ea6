package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// judge tells what a failure is: the message's, a dependency's, the
// database's, or one of a run of distinct messages failing alike.
type judge struct {
	cfg *Config
	// failures is the run of distinct messages whose handler failed with no
	// success between them (PauseAfterFailures).
	failures failureStreak
}

// failure describes a failed run to decide, asking the database and
// counting the run of failures only when decide needs them. holds are the
// message's holds so far that count against MaxHolds.
func (j *judge) failure(ctx context.Context, err error, id string, attempt, maxAttempts, holds int) failure {
	return failure{
		err: err, stopping: ctx.Err() != nil, attempt: attempt, maxAttempts: maxAttempts,
		holds: holds, maxHolds: j.cfg.MaxHolds,
		cause:  func() Cause { return j.infrastructure(ctx, err) },
		inARow: func() bool { return j.failingInARow(id, err) },
	}
}

// infrastructure names the fault of a failure that is not the message's: a
// dependency the handler found misconfigured, an SQLSTATE of the database's
// own trouble, a database step that got no answer, or a database that fails
// its check after an unknown error of a database step or a connection fault
// of the handler's. The zero Cause means the message failed.
//
// The handler's connection faults and database errors need the check: its
// own reads (the payment handler looks for a recorded payment) fail like the
// runtime's when PostgreSQL goes away, and its outside calls fail with the
// same network errors; and some SQLSTATEs that are the database's when the
// runtime meets them may be the handler's own doing (handlerMayCause). Only
// the database's answer tells them apart: without it, a handler writing
// through its read-only Reader was put back without an attempt, the check
// passed, and it failed again, a pause loop.
func (j *judge) infrastructure(ctx context.Context, err error) Cause {
	var se *stepError
	fromHandler := errors.As(err, &se) && se.step == stepHandler
	cause := pauseCause(err)
	switch {
	case !cause.isZero() && !(fromHandler && handlerMayCause(err)):
		return cause
	case se == nil, fromHandler && cause.isZero() && !connectionFault(err):
		return Cause{} // the message failed
	}
	if j.pingDatabase(ctx) != nil {
		return causeDatabase
	}
	return Cause{}
}

// handlerMayCause reports an SQLSTATE that is the database's trouble when the
// runtime's own statements meet it, but that a handler's own statement can
// cause by itself: a write through its read-only Reader (25006: a standby's
// answer), a table or column of its own it lacks or may not read. A
// handler's reads never write, so a standby cannot be the cause there.
func handlerMayCause(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && handlerMayCauseState(pg.Code)
}

// pingDatabase tells a database outage from a failure of the message. Error
// classes alone cannot: a handler's HTTP call fails with the same network
// errors, and a pool can still answer while new connections are refused.
func (j *judge) pingDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return j.cfg.DatabaseCheck(ctx)
}

// failingInARow counts a retried failure of the handler's outside-call step
// and reports whether PauseAfterFailures distinct messages have now failed in
// a row, this one included, with no success since: a dependency down for
// every message, not this message's fault.
func (j *judge) failingInARow(id string, err error) bool {
	var se *stepError
	if j.cfg.PauseAfterFailures < 0 || !errors.As(err, &se) || se.step != stepHandler {
		return false
	}
	return j.failures.fail(id, j.cfg.PauseAfterFailures) >= j.cfg.PauseAfterFailures
}

// keyExpired is the key-expiry guard, the one of both modes: a message that
// may have called out before and is older than ttl, the key lifetime of the
// services the handler calls, must not call again (with a key that may be
// forgotten, the call could do twice what the first did). It returns that
// message's PermanentError (wire.ReasonKeyExpired), nil for any other. The
// age counts from since (what names it); a zero since, or a zero ttl, turns
// the guard off. It runs after the inbox look-up (inline) or the claim
// (buffered), so a message applied already is a duplicate, not refused.
func keyExpired(ttl time.Duration, since time.Time, what string, mayHaveRun bool) error {
	if ttl <= 0 || since.IsZero() || !mayHaveRun {
		return nil
	}
	if age := time.Since(since); age > ttl {
		return Permanent(reasonKeyExpired, fmt.Errorf("%s %s ago, and it may have called out before: "+
			"its idempotency key may be forgotten (the key lifetime is %s)", what, age.Round(time.Second), ttl))
	}
	return nil
}

// permanentReason is the reason a permanent failure dead-letters (parks)
// with.
func permanentReason(err error) Reason {
	var pe *PermanentError
	switch {
	case !errors.As(err, &pe) || pe.Reason.isZero():
		return reasonPermanent
	}
	return pe.Reason
}
