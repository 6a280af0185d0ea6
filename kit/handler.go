package kit

import "github.com/inbox-template/payment-service/kit/internal/consumer"

// Handler handles the messages of one event type E: Handle runs with no
// transaction open, at least once per message, and returns the writes the
// kit runs in the inbox transaction. A handler of another event than its
// service's Events does not compile (Consume).
type Handler[E any] = consumer.HandlerOf[E]

// Message is a delivery as the handler sees it: its id (the dedupe key),
// headers, body and the attempt it is on.
type Message = consumer.Message

// Writes are a message's effect: run in the inbox transaction, committed
// with the message's inbox row or not at all; they may run more than once,
// so they touch nothing but tx.
type Writes = consumer.Writes

// Outcome is what the writes report: OutcomeProcessed or OutcomeDuplicate.
type Outcome = consumer.Outcome

// The outcomes of a message's writes.
const (
	// OutcomeProcessed: the effect was made.
	OutcomeProcessed = consumer.OutcomeProcessed
	// OutcomeDuplicate: the effect was already there (the same business key
	// under another message id).
	OutcomeDuplicate = consumer.OutcomeDuplicate
)

// NoWrites is the writes of a message with nothing to write: its inbox row
// alone commits, with outcome.
func NoWrites(outcome Outcome) Writes { return consumer.NoWrites(outcome) }

// Events declares a service's event type E: how a body is decoded (once,
// before the handler runs; a refusal dead-letters it with its reason), and
// the message id and ordering key an event gives.
type Events[E any] = consumer.Events[E]

// Reason is why a message was dead-lettered (the buffered inbox: parked), a
// snake_case word: made by NewReason, once, at package level.
type Reason = consumer.Reason

// NewReason returns the reason word; a word not in snake_case panics, so
// that a malformed reason declared at package level stops the program as
// it starts.
func NewReason(word string) Reason { return consumer.NewReason(word) }

// ReasonInvalidEvent is the reason of a body the decoder refused with an
// error that is not Permanent (and of a Permanent one whose reason is not a
// word).
var ReasonInvalidEvent = consumer.ReasonInvalidEvent

// Permanent marks err as no retry's to fix: the message is dead-lettered (the
// buffered inbox: parked) at once, with reason.
func Permanent(reason Reason, err error) error { return consumer.Permanent(reason, err) }

// Cause is why a handler asked to pause, a snake_case word made by NewCause.
type Cause = consumer.Cause

// NewCause returns the cause word; a word not in snake_case panics.
func NewCause(word string) Cause { return consumer.NewCause(word) }

// Pause says the fault is not the message's but something every message
// needs (a callee down, misconfigured): the message is put back without
// spending an attempt and the consumer pauses, up to MAX_HOLDS times.
func Pause(cause Cause, err error) error { return consumer.Pause(cause, err) }
