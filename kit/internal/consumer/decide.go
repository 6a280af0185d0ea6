package consumer

import (
	"errors"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
)

// The failure decision, in one place for both modes: decide turns a failed
// run into a verdict, and Runtime.carryOut (verdict.go) carries it out, the
// mode giving only its ways to settle (inline: on the broker; buffered:
// releasing, failing or parking the stored message).

// action is what becomes of a message whose run failed.
type action int

const (
	// actAbandon leaves the message as it is: the runtime is stopping and
	// the run was cut short (inline: unacked, redelivered later; buffered:
	// released for another replica).
	actAbandon action = iota
	// actDeadLetter ends the message with verdict.reason (inline: the
	// dead-letter exchange; buffered: parked).
	actDeadLetter
	// actPutBack gives the message back without spending its attempt.
	actPutBack
	// actPause puts the message back and pauses consumption (verdict.cause).
	actPause
	// actRetry spends the attempt and schedules the next.
	actRetry
)

func (a action) String() string {
	return [...]string{"abandon", "dead-letter", "put back", "pause", "retry"}[a]
}

// verdict is decide's answer.
type verdict struct {
	act    action
	reason Reason // actDeadLetter: the dead-letter (park) reason
	cause  Cause  // actPause: the pause cause
	// counts: actPause, and the hold counts against the message's MaxHolds
	// (the service's code asked for the pause).
	counts bool
}

// outcome is the delivery's outcome under the verdict, for its trace.
func (v verdict) outcome() string {
	switch v.act {
	case actAbandon:
		return "abandoned"
	case actDeadLetter:
		return string(OutcomeDeadLettered)
	case actRetry:
		return string(OutcomeRetried)
	}
	return string(OutcomeRequeued)
}

// errorType is the class of the failure, for its trace: the dead-letter
// reason, the pause cause, or what the action says.
func (v verdict) errorType() string {
	switch {
	case !v.reason.isZero():
		return v.reason.String()
	case !v.cause.isZero():
		return v.cause.String()
	case v.act == actPutBack:
		return "lock_wait"
	case v.act == actAbandon:
		return "shutdown"
	}
	return "retryable"
}

// failure is what decide needs to know about a failed run. The two facts
// that cost something to learn are asked only when the rules reach them:
// cause (the infrastructure at fault, the zero Cause for none: it may ask the database)
// and inARow (it counts this failure in the run of failing messages, and
// reports whether that run has reached PauseAfterFailures distinct messages).
type failure struct {
	err         error
	stopping    bool // the runtime is stopping and cut the run short
	attempt     int  // this run, 1-based, of the message's budget
	maxAttempts int
	holds       int // the times the service's code paused it before, put back each time (MaxHolds)
	maxHolds    int
	cause       func() Cause
	inARow      func() bool
}

// decide applies the rules in order: a stop cuts the run short; the
// message's own fault (a permanent error, another payload under its id) ends
// it; a dependency down or the database's trouble is nobody's fault of the
// message's and pauses, unless the service's code has asked to pause for
// this message maxHolds times already: then the message is taken to be at
// fault itself (wire.ReasonHeldTooOften); a wait on a lock puts it back; then
// the run of failures of distinct messages, which pauses when a dependency
// fails every message alike: once it has reached PauseAfterFailures, and
// until a message succeeds, a failure is the dependency's whatever the
// message's budget (a message that spent its attempts before the run
// reached the bound, and fails again while the dependency is still down,
// is put back too, not dead-lettered); below the bound, the message's own
// budget is decided; else it is retried.
//
// Only the pauses the service's code asks for (Pause) count against
// maxHolds: it claims them for one message, and may be wrong about that
// message. The runtime's own causes come from what it saw of the database or
// of many distinct messages (handler_failing), never of one message alone,
// and an outage of any length must not dead-letter good messages.
func decide(f failure) verdict {
	switch {
	case f.stopping:
		return verdict{act: actAbandon}
	case errors.Is(f.err, inbox.ErrPayloadMismatch):
		return verdict{act: actDeadLetter, reason: reasonPayloadMismatch}
	case errors.Is(f.err, ErrPermanent):
		return verdict{act: actDeadLetter, reason: permanentReason(f.err)}
	}
	if cause := f.cause(); !cause.isZero() {
		switch {
		case !askedToPause(f.err):
			return verdict{act: actPause, cause: cause}
		case f.holds >= f.maxHolds:
			return verdict{act: actDeadLetter, reason: reasonHeldTooOften}
		}
		return verdict{act: actPause, cause: cause, counts: true}
	}
	if waited(f.err) {
		return verdict{act: actPutBack}
	}
	switch {
	case f.inARow():
		return verdict{act: actPause, cause: causeFailing}
	case f.attempt >= f.maxAttempts:
		return verdict{act: actDeadLetter, reason: reasonRetriesExhausted}
	}
	return verdict{act: actRetry}
}

// askedToPause reports a pause the service's code asked for: a PauseError
// from the handler or its writes. The runtime makes none of its own.
func askedToPause(err error) bool {
	var pe *PauseError
	return errors.As(err, &pe)
}
