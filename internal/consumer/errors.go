package consumer

import (
	"errors"
	"fmt"
)

// ErrPermanent is matched by every error that must not be retried.
var ErrPermanent = errors.New("permanent failure")

// PermanentError dead-letters a message at once with Reason in its headers.
type PermanentError struct {
	Reason string // short, stable, machine-readable: "invalid_amount", "gateway_rejected"
	Err    error
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPermanent) true.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks err as not worth retrying; the message is dead-lettered with reason.
func Permanent(reason string, err error) error {
	if err == nil {
		err = errors.New(reason)
	}
	return &PermanentError{Reason: reason, Err: err}
}

// Dead-letter reasons the runtime itself assigns.
const (
	ReasonMissingID          = "missing_message_id"
	ReasonInvalidID          = "invalid_message_id"
	ReasonBodyTooLarge       = "body_too_large"
	ReasonUnsupportedContent = "unsupported_content_type"
	ReasonPayloadMismatch    = "payload_mismatch"
	ReasonRetriesExhausted   = "retries_exhausted"
	ReasonKeyExpired         = "idempotency_key_expired" // may have called out before, longer ago than the key lifetime
	ReasonPermanent          = "permanent_error"         // a PermanentError without a reason
	ReasonInvalidOrderingKey = "invalid_ordering_key"    // buffered mode: a key longer than 255 bytes, not UTF-8, or with a control character
	ReasonIngestFailed       = "ingest_failed"           // buffered mode: the store refused this message's data (SQLSTATE class 22 or 23)
)

// RefusedBeforeRun reports a dead-letter reason the runtime assigns before the
// handler runs (the delivery was refused at the door): only such a dead
// letter can be known not to have called out.
func RefusedBeforeRun(reason string) bool {
	switch reason {
	case ReasonMissingID, ReasonInvalidID, ReasonBodyTooLarge, ReasonUnsupportedContent,
		ReasonInvalidOrderingKey, ReasonIngestFailed:
		return true
	}
	return false
}

// errPanic marks a recovered handler panic; it is retried like any transient failure.
var errPanic = errors.New("handler panicked")

func panicError(v any) error { return fmt.Errorf("%w: %v", errPanic, v) }
