// Package consumer is the RabbitMQ consumer runtime: it receives deliveries with
// manual acks, dedupes them through the transactional inbox, runs one Handler per
// message inside the inbox transaction, and alone decides what happens to each
// delivery: ack after commit, delayed retry, or dead-letter with a reason. It
// keeps its own connection supervisor, so a delivery is only ever settled on the
// channel it arrived on.
package consumer

import (
	"context"
	"time"

	"gorm.io/gorm"
)

// Message is what a handler sees of a delivery.
type Message struct {
	ID          string // dedupe key: the AMQP message_id, else the id found in the body
	Body        []byte
	ContentType string
	Headers     map[string]any
	Attempt     int       // 1 on first delivery, counted in our own header across retries
	PublishedAt time.Time // the AMQP timestamp property; zero when the producer set none
}

// Outcome is the result of a message that did not fail, counted in metrics.
// Handlers may define their own, e.g. "declined".
type Outcome string

// Outcomes the runtime itself produces.
const (
	OutcomeProcessed    Outcome = "processed"
	OutcomeDuplicate    Outcome = "duplicate"
	OutcomeRetried      Outcome = "retried"
	OutcomeDeadLettered Outcome = "dead_lettered"
)

// Handler applies one message. It runs inside the inbox transaction: every write
// it makes through tx commits together with the inbox row, or not at all. The
// handler never acks, retries or logs failures itself: it returns an error and
// the runtime decides. Wrap an error with Permanent to dead-letter the message;
// any other error is retried with backoff.
//
// A handler may return OutcomeDuplicate when it finds the effect already applied
// under another message id: the inbox row still commits and the delivery is acked.
type Handler interface {
	Handle(ctx context.Context, tx *gorm.DB, msg Message) (Outcome, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx *gorm.DB, msg Message) (Outcome, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx *gorm.DB, msg Message) (Outcome, error) {
	return f(ctx, tx, msg)
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

// Stages, in the order a message passes them.
const (
	StageClaimed   Stage = "after-inbox-insert" // inbox row inserted, transaction still open
	StageCommitted Stage = "after-commit"       // effects committed, delivery not yet acked
	StageAcked     Stage = "after-ack"          // delivery acked
)
