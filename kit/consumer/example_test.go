package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/consumer"
)

// A service declares its dead-letter reasons once, at package level: a
// malformed word panics as the program starts, never at run time.
var (
	ReasonInvalidAmount = consumer.NewReason("invalid_amount")
	ReasonMalformedJSON = consumer.NewReason("malformed_json")
)

// InvoiceDue is the event of the examples.
type InvoiceDue struct {
	EventID     string `json:"event_id"`
	InvoiceID   string `json:"invoice_id"`
	AmountCents int64  `json:"amount_cents"`
}

// DecodeInvoiceDue refuses what no retry can fix, with a reason.
func DecodeInvoiceDue(body []byte) (InvoiceDue, error) {
	var ev InvoiceDue
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, consumer.Permanent(ReasonMalformedJSON, err)
	}
	if ev.AmountCents <= 0 {
		return ev, consumer.Permanent(ReasonInvalidAmount, fmt.Errorf("amount_cents %d", ev.AmountCents))
	}
	return ev, nil
}

// invoices is a handler typed to its event: Handle gets each one decoded.
type invoices struct{}

func (invoices) Handle(_ context.Context, msg consumer.Message, ev InvoiceDue) (consumer.Writes, error) {
	// Outside calls go here, with no transaction open, keyed by the
	// business entity (ev.InvoiceID), never by the message.
	return func(_ context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		// The writes run in the inbox transaction: tx.Create(...), and
		// k.Outbox.Enqueue(ctx, tx, ...) to emit events.
		return consumer.OutcomeProcessed, nil
	}, nil
}

// The reason of a permanent error is a declared value; the runtime
// dead-letters the message with it (its x-dead-letter-reason header and the
// reason label of consumer_dead_letters_total).
func ExamplePermanent() {
	_, err := DecodeInvoiceDue([]byte(`{"event_id":"e-1","invoice_id":"inv-1","amount_cents":-5}`))
	var pe *consumer.PermanentError
	fmt.Println(errors.Is(err, consumer.ErrPermanent), errors.As(err, &pe) && pe.Reason == ReasonInvalidAmount)
	fmt.Println(err)
	// Output:
	// true true
	// invalid_amount: amount_cents -5
}

// NewReason refuses a word that is not a snake_case one by panicking: in a
// package-level var, the program stops as it starts.
func ExampleNewReason() {
	defer func() { fmt.Println(recover()) }()
	_ = consumer.NewReason("Card declined")
	// Output:
	// consumer.NewReason("Card declined"): a reason is a snake_case word (a lowercase letter, then lowercase letters, digits and underscores, 64 bytes at most)
}

// A pause says a dependency fails for every message alike: the message goes
// back without spending an attempt and consumption pauses, readiness naming
// the cause.
func ExamplePause() {
	causeGatewayMisconfigured := consumer.NewCause("gateway_misconfigured")
	err := consumer.Pause(causeGatewayMisconfigured, errors.New("gateway answered 401"))
	var pe *consumer.PauseError
	fmt.Println(errors.Is(err, consumer.ErrPaused), errors.As(err, &pe) && pe.Cause == causeGatewayMisconfigured)
	fmt.Println(err)
	// Output:
	// true true
	// gateway_misconfigured: gateway answered 401
}

// Events describes the event a handler consumes: its decoder, its dedupe key
// for a message without a message_id, its ordering key in the buffered mode.
// A service's own test runs a message as the runtime does: Decode, then the
// typed handler through Typed.
func ExampleEvents() {
	events := consumer.Events[InvoiceDue]{
		Decode:      DecodeInvoiceDue,
		ID:          func(e InvoiceDue) string { return e.EventID },
		OrderingKey: func(e InvoiceDue) string { return e.InvoiceID },
	}
	msg, err := consumer.Decode(events, consumer.Message{Body: []byte(`{"event_id":"e-1","invoice_id":"inv-1","amount_cents":1200}`)})
	fmt.Println(msg.ID, err)
	writes, err := consumer.Typed[InvoiceDue](invoices{}).Handle(context.Background(), msg)
	fmt.Println(writes != nil, err)
	_, err = consumer.Decode(events, consumer.Message{Body: []byte(`{"amount_cents":`)})
	fmt.Println(err)
	// Output:
	// e-1 <nil>
	// true <nil>
	// malformed_json: decode: unexpected end of JSON input
}
