package consumer

import (
	"errors"
	"fmt"

	"github.com/inbox-template/payment-service/kit/wire"
)

// ErrPermanent is matched by every error that must not be retried.
var ErrPermanent = errors.New("permanent failure")

// Reason says why a message was dead-lettered (or parked): its
// x-dead-letter-reason header and the reason label of
// consumer_dead_letters_total. It is a short, stable snake_case word
// ("invalid_amount", "gateway_rejected"), never text made from an error: a
// metric label per distinct value.
type Reason string

// Valid reports whether r has the form of a reason: a lowercase letter, then
// lowercase letters, digits and underscores, 64 bytes at most.
func (r Reason) Valid() bool { return validWord(string(r)) }

func validWord(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// PermanentError dead-letters a message at once with Reason in its headers.
type PermanentError struct {
	Reason Reason
	Err    error
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPermanent) true.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks err as not worth retrying; the message is dead-lettered with
// reason. A reason not of the form of one (Reason.Valid) becomes
// wire.ReasonInvalidReason, with the reason given kept in the error's text.
func Permanent(reason Reason, err error) error {
	if err == nil {
		err = errors.New(string(reason))
	}
	if !reason.Valid() {
		err = fmt.Errorf("the handler's reason %q is not a snake_case word: %w", string(reason), err)
		reason = wire.ReasonInvalidReason
	}
	return &PermanentError{Reason: reason, Err: err}
}

// errPanic marks a recovered handler panic; it is retried like any transient failure.
var errPanic = errors.New("handler panicked")

func panicError(v any) error { return fmt.Errorf("%w: %v", errPanic, v) }
