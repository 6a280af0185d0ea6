package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	lockWait := &pgconn.PgError{Code: "55P03"}
	handlerPause := failedAt(stepHandler, Pause(NewCause("gateway_misconfigured"), errors.New("401")))
	cases := []struct {
		name     string
		f        failure
		cause    Cause
		inARow   bool
		want     verdict
		asked    bool // whether the run of failures counted this one
		noCauses bool // decided before the cause is asked
	}{
		{name: "stopping", f: failure{err: context.Canceled, stopping: true, attempt: 5, maxAttempts: 5},
			want: verdict{act: actAbandon}, noCauses: true},
		{name: "permanent with a reason", f: failure{err: Permanent(NewReason("invalid_amount"), nil), attempt: 1, maxAttempts: 5},
			want: verdict{act: actDeadLetter, reason: kitReason("invalid_amount")}, noCauses: true},
		{name: "permanent without one", f: failure{err: &PermanentError{}, attempt: 1, maxAttempts: 5},
			want: verdict{act: actDeadLetter, reason: reasonPermanent}, noCauses: true},
		{name: "payload mismatch", f: failure{err: fmt.Errorf("x: %w", inbox.ErrPayloadMismatch), attempt: 1, maxAttempts: 5},
			want: verdict{act: actDeadLetter, reason: reasonPayloadMismatch}, noCauses: true},
		{name: "database down on the last attempt", f: failure{err: errors.New("eof"), attempt: 5, maxAttempts: 5}, cause: CauseDatabase,
			want: verdict{act: actPause, cause: CauseDatabase}},
		{name: "lock wait on the last attempt", f: failure{err: lockWait, attempt: 5, maxAttempts: 5},
			want: verdict{act: actPutBack}},
		{name: "last attempt below the run's bound", f: failure{err: errTransient, attempt: 5, maxAttempts: 5},
			want: verdict{act: actDeadLetter, reason: reasonRetriesExhausted}, asked: true},
		// Once the run has reached its bound (and until a success), a
		// message that spent its budget before and fails again is the
		// dependency's failure, not its own.
		{name: "last attempt at the run's bound", f: failure{err: errTransient, attempt: 5, maxAttempts: 5}, inARow: true,
			want: verdict{act: actPause, cause: CauseFailing}, asked: true},
		{name: "run of failures", f: failure{err: errTransient, attempt: 2, maxAttempts: 5}, inARow: true,
			want: verdict{act: actPause, cause: CauseFailing}, asked: true},
		{name: "retry", f: failure{err: errTransient, attempt: 1, maxAttempts: 5},
			want: verdict{act: actRetry}, asked: true},
		// A pause the handler (or its writes) asked for counts against the
		// message's holds; after maxHolds of them it is the message's fault.
		// The runtime's own pauses and lock waits never count.
		{name: "the handler's pause within the bound", f: failure{err: handlerPause, attempt: 1, maxAttempts: 5, holds: 2, maxHolds: 3},
			cause: NewCause("gateway_misconfigured"), want: verdict{act: actPause, cause: NewCause("gateway_misconfigured"), counts: true}},
		{name: "the handler's pause past the bound", f: failure{err: handlerPause, attempt: 1, maxAttempts: 5, holds: 3, maxHolds: 3},
			cause: NewCause("gateway_misconfigured"), want: verdict{act: actDeadLetter, reason: reasonHeldTooOften}},
		{name: "the writes' pause past the bound", f: failure{err: failedAt(stepCommit, Pause(NewCause("ledger_locked"), nil)), attempt: 1, maxAttempts: 5, holds: 3, maxHolds: 3},
			cause: NewCause("ledger_locked"), want: verdict{act: actDeadLetter, reason: reasonHeldTooOften}},
		{name: "database down past the bound", f: failure{err: failedAt(stepCommit, io.ErrUnexpectedEOF), attempt: 1, maxAttempts: 5, holds: 3, maxHolds: 3},
			cause: CauseDatabase, want: verdict{act: actPause, cause: CauseDatabase}},
		{name: "lock wait past the bound", f: failure{err: lockWait, attempt: 1, maxAttempts: 5, holds: 3, maxHolds: 3},
			want: verdict{act: actPutBack}},
		{name: "run of failures past the bound", f: failure{err: errTransient, attempt: 2, maxAttempts: 5, holds: 3, maxHolds: 3}, inARow: true,
			want: verdict{act: actPause, cause: CauseFailing}, asked: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			causeAsked, counted := false, false
			c.f.cause = func() Cause { causeAsked = true; return c.cause }
			c.f.inARow = func() bool { counted = true; return c.inARow }
			if got := decide(c.f); got != c.want {
				t.Errorf("decide = %+v (%s), want %+v (%s)", got, got.act, c.want, c.want.act)
			}
			if counted != c.asked {
				t.Errorf("counted in the run of failures: %v, want %v", counted, c.asked)
			}
			if c.noCauses && causeAsked {
				t.Error("asked for the infrastructure's fault of a failure decided without it")
			}
		})
	}
}
