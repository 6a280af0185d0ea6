// Package wire is the kit's contract on the wire: the headers it reads and
// writes on AMQP messages and the reasons it dead-letters with. It imports
// nothing of the kit, so that whatever reads the kit's messages (the dead-letter tools,
// the fault kit, a service's tests) needs none of the runtime.
package wire

import "strings"

// Headers of ours. The attempt count travels in our own header because x-death
// counting changed in RabbitMQ 3.13 and the quorum delivery limit in 4.3.
const (
	HeaderAttempt          = "x-attempt"
	HeaderDeadLetterReason = "x-dead-letter-reason"
	HeaderDeadLetterError  = "x-dead-letter-error"
	HeaderDeadLetteredAt   = "x-dead-lettered-at"
	HeaderDeadLetterBy     = "x-dead-letter-consumer"
	HeaderFirstError       = "x-first-error"
	HeaderLastError        = "x-last-error"
	HeaderOriginalExchange = "x-original-exchange"
	HeaderOriginalKey      = "x-original-routing-key"
	HeaderHeld             = "x-held" // times put back without spending an attempt
	// HeaderPauseHolds counts the holds a pause the service's code asked for
	// (kit.Pause) cost the message: MAX_HOLDS bounds them. Like x-attempt, it is
	// read only from a delivery that came back from one of our delay queues.
	HeaderPauseHolds = "x-pause-holds"
	// HeaderMayHaveRun marks every copy the kit makes of a message that may
	// have run (kit.Message.MayHaveRun): a copy has neither the broker's
	// redelivered flag nor, once replayed, our attempt count, and without the
	// mark the key-expiry guard would take it for a first attempt.
	HeaderMayHaveRun = "x-may-have-run"
	// HeaderHeadersDropped, on a dead letter headers_too_large, is the size
	// of the producer's properties and headers, left out of the copy.
	HeaderHeadersDropped = "x-headers-dropped"
)

// HeaderTimestampMillis is the publish time in milliseconds since the epoch,
// the header RabbitMQ's message timestamp plugin sets; the AMQP timestamp
// property has whole seconds only.
const HeaderTimestampMillis = "timestamp_in_ms"

// Dead-letter reasons the kit itself assigns, as the header's value
// (d.Headers[HeaderDeadLetterReason] == ReasonX); the runtime holds them as
// kit.Reason values, as a service declares its own. A header holds the
// word: compare it with a service's declared reason as
// d.Headers[HeaderDeadLetterReason] == reason.String().
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
	ReasonInvalidReason      = "invalid_reason"          // the handler, its writes or the Decoder made a reason (a pause cause) of a malformed word at run time
	ReasonNoOutcome          = "writes_without_outcome"  // the writes returned no outcome and no error
	ReasonInvalidEvent       = "invalid_event"           // the Decoder refused the body with an error that is not a PermanentError
	// ReasonHeadersTooLarge: the message's properties and headers leave no
	// room in one frame for the runtime's: its dead letter leaves the
	// producer's headers out (HeaderHeadersDropped says how many bytes).
	ReasonHeadersTooLarge = "headers_too_large"
)

// RefusedBeforeRun reports a dead-letter reason the runtime assigns before the
// handler runs (the delivery was refused at the door): only such a dead
// letter can be known not to have called out.
func RefusedBeforeRun(reason string) bool {
	switch reason {
	case ReasonMissingID, ReasonInvalidID, ReasonBodyTooLarge, ReasonUnsupportedContent,
		ReasonInvalidOrderingKey, ReasonIngestFailed, ReasonHeadersTooLarge:
		return true
	}
	return false
}

// MarkedAsRun reports whether headers carry HeaderMayHaveRun. A producer that
// sets it only makes the key-expiry guard stricter, so it is trusted.
func MarkedAsRun(headers map[string]any) bool {
	v, ok := headers[HeaderMayHaveRun]
	return ok && v != false
}

// MaxErrorText is the most bytes of an error's text the kit writes into a
// header (x-first-error, x-last-error, x-dead-letter-error) or a row's
// last_error, before the ellipsis.
const MaxErrorText = 1024

// ErrorText is s as the kit writes an error's text: valid UTF-8 (an invalid
// byte becomes U+FFFD), without NUL (PostgreSQL's text refuses it), cut to
// MaxErrorText bytes at a rune's boundary with an ellipsis after it.
func ErrorText(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) <= MaxErrorText {
		return s
	}
	return strings.ToValidUTF8(s[:MaxErrorText], "") + "…"
}
