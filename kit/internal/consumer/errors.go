package consumer

import (
	"cmp"
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
//
// A service declares each of its reasons once, at package level:
//
//	var ReasonInvalidAmount = consumer.NewReason("invalid_amount")
//
// NewReason panics on a word not of the form of a reason, so a malformed
// reason declared so stops the program as it starts, before it consumes
// anything; a string does not convert to a Reason. Made at run time in the
// handler, its writes or a Decoder, a malformed word dead-letters (parks)
// the message wire.ReasonInvalidReason at once; a well-formed one made from
// text would be a metric label per value: declare them all. The zero Reason
// is no reason: Permanent gives it wire.ReasonPermanent.
type Reason struct{ word }

// NewReason returns the reason named w. It panics if w is not a snake_case
// word: a lowercase letter, then lowercase letters, digits and underscores,
// 64 bytes at most. Call it in a package-level var, so that a bad word fails
// at start.
func NewReason(w string) Reason { return Reason{mustWord("NewReason", "a reason", w)} }

// kitReason is one of the kit's own reasons (wire.Reason*), which are words.
func kitReason(w string) Reason { return Reason{word{w}} }

// word is a Reason's or a Cause's snake_case word; its String is the word
// as a header, a metric label and readiness carry it, its MarshalText the
// word for a log's JSON.
type word struct{ s string }

func (w word) String() string               { return w.s }
func (w word) MarshalText() ([]byte, error) { return []byte(w.s), nil }
func (w word) isZero() bool                 { return w.s == "" }

// mustWord is s as a word, or the panic (wordError) of constructor, which
// makes what.
func mustWord(constructor, what, s string) word {
	if !validWord(s) {
		panic(&wordError{fmt.Sprintf("consumer.%s(%q): %s is a snake_case word "+
			"(a lowercase letter, then lowercase letters, digits and underscores, 64 bytes at most)", constructor, s, what)})
	}
	return word{s}
}

// The kit's own reasons, as values.
var (
	reasonMissingID          = kitReason(wire.ReasonMissingID)
	reasonInvalidID          = kitReason(wire.ReasonInvalidID)
	reasonBodyTooLarge       = kitReason(wire.ReasonBodyTooLarge)
	reasonUnsupportedContent = kitReason(wire.ReasonUnsupportedContent)
	reasonPayloadMismatch    = kitReason(wire.ReasonPayloadMismatch)
	reasonRetriesExhausted   = kitReason(wire.ReasonRetriesExhausted)
	reasonHeldTooOften       = kitReason(wire.ReasonHeldTooOften)
	reasonKeyExpired         = kitReason(wire.ReasonKeyExpired)
	reasonPermanent          = kitReason(wire.ReasonPermanent)
	reasonInvalidOrderingKey = kitReason(wire.ReasonInvalidOrderingKey)
	reasonIngestFailed       = kitReason(wire.ReasonIngestFailed)
	reasonHeadersTooLarge    = kitReason(wire.ReasonHeadersTooLarge)
	reasonNoOutcome          = kitReason(wire.ReasonNoOutcome)
	reasonInvalidEvent       = kitReason(wire.ReasonInvalidEvent)
	reasonInvalidReason      = kitReason(wire.ReasonInvalidReason)
)

// Two of the kit's reasons a service's code may give itself (the kit
// compares its own copies):
var (
	// ReasonNoOutcome is the reason of writes that return no outcome and no
	// error; a service's own test double of a handler may use it too.
	ReasonNoOutcome = reasonNoOutcome
	// ReasonInvalidEvent is the reason of a body the Decoder refused with an
	// error that is not a PermanentError; a Decoder may give it itself.
	ReasonInvalidEvent = reasonInvalidEvent
)

// wordError is the panic of NewReason and NewCause on a malformed word. At
// start (a package-level var) it stops the program; a handler, its writes or
// a Decoder that made one at run time has its message dead-lettered (parked)
// wire.ReasonInvalidReason at once, the word in the error (panicError).
type wordError struct{ msg string }

func (e *wordError) Error() string { return e.msg }

// PermanentError dead-letters a message at once with Reason in its headers.
type PermanentError struct {
	Reason Reason
	Err    error
}

func (e *PermanentError) Error() string {
	word := cmp.Or(e.Reason.String(), wire.ReasonPermanent)
	if e.Err == nil {
		return word
	}
	return word + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPermanent) true.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks err as not worth retrying; the message is dead-lettered with
// reason (the zero Reason: wire.ReasonPermanent).
func Permanent(reason Reason, err error) error {
	return &PermanentError{Reason: reason, Err: err}
}

// errPanic marks a recovered handler panic; it is retried like any transient failure.
var errPanic = errors.New("handler panicked")

// panicError is the error of a recovered panic: retried, but for a malformed
// reason or cause made at run time, which no retry mends.
func panicError(v any) error {
	if we, ok := v.(*wordError); ok {
		return Permanent(reasonInvalidReason, we)
	}
	return fmt.Errorf("%w: %v", errPanic, v)
}

// validWord reports whether s has the form of a reason or a cause: a
// lowercase letter, then lowercase letters, digits and underscores, 64 bytes
// at most.
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
