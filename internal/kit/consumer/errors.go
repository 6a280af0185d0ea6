package consumer

import (
	"errors"
	"fmt"
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
// ReasonInvalidReason, with the reason given kept in the error's text.
func Permanent(reason Reason, err error) error {
	if err == nil {
		err = errors.New(string(reason))
	}
	if !reason.Valid() {
		err = fmt.Errorf("the handler's reason %q is not a snake_case word: %w", string(reason), err)
		reason = ReasonInvalidReason
	}
	return &PermanentError{Reason: reason, Err: err}
}

// Dead-letter reasons the runtime itself assigns. They are untyped, as a
// service's own should be: a Reason where one is expected, a string where
// they meet a header's value (d.Headers[HeaderDeadLetterReason] == ReasonX).
const (
	ReasonMissingID          = "missing_message_id"
	ReasonInvalidID          = "invalid_message_id"
	ReasonBodyTooLarge       = "body_too_large"
	ReasonUnsupportedContent = "unsupported_content_type"
	ReasonPayloadMismatch    = "payload_mismatch"
	ReasonRetriesExhausted   = "retries_exhausted"
	ReasonHeldTooOften       = "held_too_often"          // put back MaxHolds times by the handler's Pause: the message's fault, not the dependency's
	ReasonKeyExpired         = "idempotency_key_expired" // may have called out before, longer ago than the key lifetime
	ReasonPermanent          = "permanent_error"         // a PermanentError without a reason
	ReasonInvalidOrderingKey = "invalid_ordering_key"    // buffered mode: a key longer than 255 bytes, not UTF-8, or with a control character
	ReasonIngestFailed       = "ingest_failed"           // buffered mode: the store refused this message's data (SQLSTATE class 22 or 23)
	ReasonInvalidReason      = "invalid_reason"          // the handler gave Permanent a reason not of the form of one
	ReasonNoOutcome          = "writes_without_outcome"  // the writes returned no outcome and no error
	// ReasonHeadersTooLarge: the message's properties and headers leave no
	// room in one frame for the runtime's: its dead letter leaves the
	// producer's headers out (HeaderHeadersDropped says how many bytes).
	ReasonHeadersTooLarge = "headers_too_large"
)

// RefusedBeforeRun reports a dead-letter reason the runtime assigns before the
// handler runs (the delivery was refused at the door): only such a dead
// letter can be known not to have called out.
func RefusedBeforeRun(reason string) bool {
	switch Reason(reason) {
	case ReasonMissingID, ReasonInvalidID, ReasonBodyTooLarge, ReasonUnsupportedContent,
		ReasonInvalidOrderingKey, ReasonIngestFailed, ReasonHeadersTooLarge:
		return true
	}
	return false
}

// errPanic marks a recovered handler panic; it is retried like any transient failure.
var errPanic = errors.New("handler panicked")

func panicError(v any) error { return fmt.Errorf("%w: %v", errPanic, v) }
