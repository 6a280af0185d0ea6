// Package consumer is the RabbitMQ consumer runtime: it receives deliveries with
// manual acks, dedupes them through the transactional inbox, runs one Handler per
// message, commits the handler's writes in the inbox transaction (several
// messages' at once with group commit), and alone decides what happens to each
// delivery: ack after commit, delayed retry, or dead-letter with a reason. It
// keeps its own connection supervisor, so a delivery is only ever settled on the
// channel it arrived on.
//
// The two inbox modes sit behind one small interface (mode.go), each in its
// own files: inline.go and inline_*.go (look-up, handler, group commit, ack
// after commit), buffered.go and buffered_*.go (ingest, claim, process,
// final commit). Both share the rest: the broker session (session.go), the
// door where a delivery becomes a message (message.go, decoder.go), the
// judge of a failure (failure.go) and the decision (decide.go), carried out
// in one place (verdict.go) by each mode's settler, the mover of deliveries
// on the broker (settle.go), the batching of commits (batch.go) and the
// metrics. The runnable examples (example_test.go) show the author's side.
package consumer

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/wire"
)

// Message is what a handler sees of a delivery.
type Message struct {
	ID          string // dedupe key: the AMQP message_id, else the id found in the body
	Body        []byte
	ContentType string
	// Exchange and RoutingKey are where the message was published (a copy
	// the runtime made carries the original's): a service that consumes
	// several events routes each message by them (Routed). Exchange is ""
	// when that is unknown (a message published straight to the work queue:
	// RoutingKey is then its delivery's, "" in the buffered mode).
	Exchange    string
	RoutingKey  string
	Headers     map[string]any
	Attempt     int       // 1 on first delivery, counted in our own header across retries
	Redelivered bool      // the broker delivered it before (a crash, a lost connection)
	PublishedAt time.Time // the timestamp_in_ms header, else the AMQP timestamp; zero when the producer set neither
	// Event is what the service's Decoder (Config.Decoder) made of Body: a
	// HandlerOf gets it as its argument, an untyped Handler reads it with
	// EventOf. Nil without a Decoder.
	Event any
	// ran is set once the handler was called on this delivery: every copy
	// the runtime makes of it from then on carries wire.HeaderMayHaveRun.
	ran bool
	// seenAt is when the runtime received the delivery: a copy of a message
	// without a publish time carries it as one, so that the key-expiry guard
	// can bound the copy's age.
	seenAt time.Time
	// orderingKey is the Decoder's ordering key of the event; undecoded
	// the Decoder's refusal of the body (a PermanentError).
	orderingKey string
	undecoded   error
	// holds counts the pauses the service's code asked for that put this
	// message back (wire.HeaderPauseHolds; the buffered mode's holds column).
	holds int
}

// MayHaveRun reports whether the message may have been handled before, and so
// may have called out already: a retry, a redelivery by the broker, a copy put
// back without spending an attempt, or any copy the kit made of a message
// that had run (a replayed dead letter, an exported parked message, a
// delivery returned at a stop), which carries wire.HeaderMayHaveRun. Idempotency
// keys make a second call safe only while the called service remembers them.
func (m Message) MayHaveRun() bool {
	if m.ran || m.Attempt > 1 || m.Redelivered {
		return true
	}
	_, held := m.Headers[wire.HeaderHeld]
	return held || wire.MarkedAsRun(m.Headers)
}

// Outcome is the result of a message that did not fail, counted in metrics.
// Handlers may define their own, e.g. "declined".
type Outcome string

// Outcomes the runtime itself produces.
const (
	OutcomeProcessed    Outcome = "processed"
	OutcomeDuplicate    Outcome = "duplicate"
	OutcomeRetried      Outcome = "retried"
	OutcomeRequeued     Outcome = "requeued" // put back without spending an attempt: not the message's fault
	OutcomeDeadLettered Outcome = "dead_lettered"
	// The buffered mode's: a delivery stored for processing (and acked), and
	// a stored message parked for an operator.
	OutcomeStored Outcome = "stored"
	OutcomeParked Outcome = "parked"
)

// Handler applies one message in two steps, so that no database connection is
// held while it waits on the outside world.
//
// Handle runs with no transaction open: it decodes and validates the message
// and makes its outside calls, each with an idempotency key derived from the
// business entity (never from the message or the attempt). It then returns its
// database writes. The runtime runs them in the transaction that claims the
// message in the inbox and acks the delivery only after that transaction
// commits. If the message turns out to be applied already (a redelivery racing
// another replica), the writes do not run at all.
//
// The handler never acks, retries or logs failures itself: it returns an error
// and the runtime decides. Wrap an error with Permanent to dead-letter the
// message; any other error is retried with backoff. The same holds for the
// error the writes return.
type Handler interface {
	Handle(ctx context.Context, msg Message) (Writes, error)
}

// Writes are a message's database effects. They run inside the inbox
// transaction, under a savepoint of their own when several messages commit
// together: every write through tx commits with the message's inbox row, or
// not at all. Use only tx, keep no reference to it, and make the writes safe
// against a concurrent message for the same entity (a unique key with
// ON CONFLICT DO NOTHING, say).
//
// Every message ends with an outcome the writes return, and OutcomeDuplicate
// is the one way to say "already applied": the effect is already there
// under another message id (the inbox row still commits, and the message
// counts as a duplicate). A handler that knows before any transaction,
// or has nothing to write, returns NoWrites(outcome). Writes that return no
// outcome and no error, and a Handle that returns nil writes and no error,
// are refused: the message is dead-lettered (parked) with wire.ReasonNoOutcome
// and nothing of it commits.
//
// Writes may run more than once: when a message committed with them fails,
// the batch runs again (with a savepoint per message, then a transaction
// per message); only the last run commits, so they must do nothing but
// write through tx.
type Writes func(ctx context.Context, tx *gorm.DB) (Outcome, error)

// NoWrites is the writes of a message with nothing to write: its inbox row
// commits alone, counted as outcome. NoWrites(OutcomeDuplicate) says that
// the handler found the message's effect already there under another
// message id.
func NoWrites(outcome Outcome) Writes {
	return func(context.Context, *gorm.DB) (Outcome, error) { return outcome, nil }
}

// HandlerOf is a Handler typed to the event it handles: Handle gets the event
// the service's Events[E] made of the message's body with the message. Wired
// with service.Consume, a HandlerOf of one event type and an Events of
// another do not compile together (read with EventOf, that mismatch was
// found at run time, and every message was dead-lettered).
type HandlerOf[E any] interface {
	Handle(ctx context.Context, msg Message, ev E) (Writes, error)
}

// Typed is the Handler that runs h with each message's decoded event. A
// message that carries none of type E (no Decoder, or one of another type)
// is refused as EventOf refuses it.
func Typed[E any](h HandlerOf[E]) Handler { return typed[E]{h} }

type typed[E any] struct{ h HandlerOf[E] }

func (t typed[E]) Handle(ctx context.Context, msg Message) (Writes, error) {
	ev, err := EventOf[E](msg)
	if err != nil {
		return nil, err
	}
	return t.h.Handle(ctx, msg, ev)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, msg Message) (Writes, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, msg Message) (Writes, error) {
	return f(ctx, msg)
}

// Middleware wraps a handler with cross-cutting behaviour.
type Middleware func(Handler) Handler

// Chain applies middlewares so that the first is the outermost.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Stage is a point in the flow of a message that the runtime reports to
// Config.OnStage, for fault injection and tracing.
type Stage string

// Stages, in the order a message passes them. Each is named as its crash
// point is (faults.After…, the same string): StageInboxInsert is
// "after-inbox-insert". A handler's own points (after an outside call) lie
// before StageInboxInsert: the transaction opens only once the handler has
// returned its writes.
//
// In the buffered mode the first three are the ingest's (the message stored,
// the transaction still open; committed, not acked; acked), and two more are
// the processing's: a message claimed, its handler not yet run; its writes
// and status committed.
const (
	StageInboxInsert   Stage = "after-inbox-insert"   // inbox row inserted (buffered: the message stored), transaction still open
	StageCommit        Stage = "after-commit"         // effects (buffered: the stored message) committed, delivery not yet acked
	StageAck           Stage = "after-ack"            // delivery acked (the ack sent, or held up to 5 ms to join a multiple ack: acks.go)
	StageClaim         Stage = "after-claim"          // buffered: a stored message claimed, the handler not yet run
	StageProcessCommit Stage = "after-process-commit" // buffered: the handler's writes and the processed status committed
)
