package consumer

import (
	"errors"
	"fmt"
	"reflect"
)

// A Decoder decodes each delivery's body once, for the runtime and the
// handler: the runtime takes the dedupe key and the ordering key from the
// event, and hands the event to the handler as Message.Event. Events[E] is
// the one implementation.
type Decoder interface {
	decode(o origin, body []byte) (decoded, error)
	ordered() bool
	eventType() reflect.Type
}

// EventType is the type of the events d decodes, nil for no Decoder.
func EventType(d Decoder) reflect.Type {
	if d == nil {
		return nil
	}
	return d.eventType()
}

// Events describes the event type E a handler consumes, given to
// service.Consume with the handler's constructor (a HandlerOf[E]: the
// handler gets each event decoded, and one of another type does not
// compile):
//
//	service.Consume(opts, consumer.Events[billing.InvoiceDue]{
//		Decode:      decodeInvoiceDue,
//		ID:          func(e billing.InvoiceDue) string { return e.EventID },
//		OrderingKey: func(e billing.InvoiceDue) string { return e.InvoiceID },
//	}, newHandler)
type Events[E any] struct {
	// Decode parses and validates a body. It runs before the handler, once
	// the body passed the size and content-type checks. A body it refuses is
	// dead-lettered at once inline, and parked when processed in the
	// buffered mode (stored as a key of its own), with the reason of a
	// PermanentError (Permanent) or else ReasonInvalidEvent. It must be
	// pure: the buffered mode decodes a stored message again to process it.
	// With its refusal it may return the event as far as it read it: a body
	// without a message_id property is then dead-lettered under the ID of
	// that event, where ID reads a valid one, so that an operator can find
	// it (dlq list, dlq replay --id).
	Decode func(body []byte) (E, error)
	// ID, if set, is the dedupe key of a delivery without a message_id
	// property; nil requires the property.
	ID func(E) string
	// OrderingKey, if set, names the event's ordering key in the buffered
	// mode ("" makes the message a key of its own).
	OrderingKey func(E) string
}

// decoded is what a Decoder made of one body.
type decoded struct {
	event       any
	id          string
	orderingKey string
}

func (e Events[E]) decode(_ origin, body []byte) (decoded, error) {
	ev, err := e.Decode(body)
	if err != nil {
		return decoded{id: e.refusedID(ev)}, err
	}
	d := decoded{event: ev}
	if e.ID != nil {
		d.id = e.ID(ev)
	}
	if e.OrderingKey != nil {
		d.orderingKey = e.OrderingKey(ev)
	}
	return d, nil
}

// refusedID is the ID of the event Decode returned with its refusal, only
// to name the refused message: "" when there is none, or when ID cannot take
// a partly read event (it panics), since the message is refused for the
// Decoder's reason all the same.
func (e Events[E]) refusedID(ev E) (id string) {
	if e.ID == nil {
		return ""
	}
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	return e.ID(ev)
}

func (e Events[E]) ordered() bool { return e.OrderingKey != nil }

func (e Events[E]) eventType() reflect.Type { return reflect.TypeFor[E]() }

// Ordered reports whether d names ordering keys.
func Ordered(d Decoder) bool { return d != nil && d.ordered() }

// decodeReason is the dead-letter reason of a body the Decoder refused.
func decodeReason(err error) Reason {
	var pe *PermanentError
	if errors.As(err, &pe) {
		return permanentReason(err)
	}
	return reasonInvalidEvent
}

// refusal is the Decoder's err as the runtime dead-letters it: a
// PermanentError with decodeReason's reason, its text naming the reason once.
func refusal(err error) error {
	cause := err
	if pe := (*PermanentError)(nil); errors.As(err, &pe) && pe.Err != nil {
		cause = pe.Err // the reason once in the text, not twice
	}
	return Permanent(decodeReason(err), fmt.Errorf("decode: %w", cause))
}

// Decode fills msg.Event with d's decoding of msg.Body, and msg.ID, if it is
// empty, with the event's ID: what the runtime does before it calls the
// handler, for a service's tests that call the handler themselves. The error
// is a PermanentError, with the reason the runtime would dead-letter with.
func Decode(d Decoder, msg Message) (Message, error) {
	out, err := d.decode(origin{msg.Exchange, msg.RoutingKey}, msg.Body)
	if err != nil {
		return msg, refusal(err)
	}
	msg.Event = out.event
	if msg.ID == "" {
		msg.ID = out.id
	}
	return msg, nil
}

// EventOf returns the event the Decoder made of msg's body: E is the type
// parameter of the service's Events. A message without one (no Decoder, or
// one of another type: a wiring mistake) gives a PermanentError,
// ReasonInvalidEvent, and the message is dead-lettered (parked) saying so.
func EventOf[E any](msg Message) (E, error) {
	ev, ok := msg.Event.(E)
	if !ok {
		return ev, Permanent(reasonInvalidEvent, fmt.Errorf("message %s carries no decoded %T but %T: "+
			"wire the handler with kit.Consume and kit.Events[%T]", msg.ID, ev, msg.Event, ev))
	}
	return ev, nil
}
