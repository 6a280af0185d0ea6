package service

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
)

type placed struct{ ID string }

type placedHandler struct{ got *placed }

func (h placedHandler) Handle(_ context.Context, _ consumer.Message, ev placed) (consumer.Writes, error) {
	*h.got = ev
	return consumer.NoWrites(consumer.OutcomeProcessed), nil
}

var placedEvents = consumer.Events[placed]{
	Decode: func(b []byte) (placed, error) { return placed{ID: string(b)}, nil },
	ID:     func(e placed) string { return e.ID },
}

// Consume sets the Decoder and a handler that gets the decoded event; it
// refuses options that set either already, Events without Decode, and a
// constructor that returns no handler.
func TestConsume(t *testing.T) {
	var got placed
	opts := Consume(shippingBase(), placedEvents, func(*Kit) (consumer.HandlerOf[placed], error) { return placedHandler{&got}, nil })
	if err := opts.validate(); err != nil {
		t.Fatal(err)
	}
	h, err := opts.NewHandler(&Kit{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := consumer.Decode(opts.Decoder, consumer.Message{Body: []byte("order-1")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(context.Background(), msg); err != nil || got.ID != "order-1" || msg.ID != "order-1" {
		t.Errorf("handled %+v (message id %q), %v; want the event order-1", got, msg.ID, err)
	}

	withDecoder := shippingBase()
	withDecoder.Decoder = placedEvents
	noDecode := consumer.Events[placed]{}
	for name, o := range map[string]Options{
		"a Decoder already":   Consume(withDecoder, placedEvents, func(*Kit) (consumer.HandlerOf[placed], error) { return placedHandler{&got}, nil }),
		"Events no Decode":    Consume(shippingBase(), noDecode, func(*Kit) (consumer.HandlerOf[placed], error) { return placedHandler{&got}, nil }),
		"settings, no Decode": ConsumeWithSettings(shippingBase(), noDecode, func(*Kit, *shippingSettings) (consumer.HandlerOf[placed], error) { return placedHandler{&got}, nil }),
	} {
		if err := o.validate(); err == nil {
			t.Errorf("%s: options accepted", name)
		}
	}
	// Each refusal names the function that was called wrong.
	withSettings := shippingBase()
	withSettings.Settings = &shippingSettings{}
	withKey := shippingBase()
	withKey.KeyFromBody = JSONField("id")
	for want, o := range map[string]Options{
		"ConsumeWithSettings sets Settings":                                       ConsumeWithSettings(withSettings, placedEvents, func(*Kit, *shippingSettings) (placedHandler, error) { return placedHandler{&got}, nil }),
		"Consume: KeyFromBody and OrderingKey are the Events' ID and OrderingKey": Consume(withKey, placedEvents, func(*Kit) (placedHandler, error) { return placedHandler{&got}, nil }),
	} {
		if err := o.validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want a refusal saying %q, got %v", want, err)
		}
	}

	nilHandler := Consume(shippingBase(), placedEvents, func(*Kit) (consumer.HandlerOf[placed], error) { return nil, nil })
	if _, err := nilHandler.NewHandler(&Kit{}); err == nil || !strings.Contains(err.Error(), "returned no handler") {
		t.Errorf("a constructor returning no handler: %v", err)
	}
	nilPointer := Consume(shippingBase(), placedEvents, func(*Kit) (*placedHandler, error) { return nil, nil })
	if _, err := nilPointer.NewHandler(&Kit{}); err == nil || !strings.Contains(err.Error(), "returned no handler") {
		t.Errorf("a constructor returning a nil *placedHandler: %v", err)
	}
	// A Decoder of another event put in after Consume is refused at start:
	// every message would be refused at run time.
	replaced := Consume(shippingBase(), placedEvents, func(*Kit) (placedHandler, error) { return placedHandler{&got}, nil })
	replaced.Decoder = consumer.Events[string]{Decode: func(b []byte) (string, error) { return string(b), nil }}
	if err := replaced.validate(); err == nil || !strings.Contains(err.Error(), "wired for service.placed events, but the Decoder decodes string") {
		t.Errorf("a Decoder of another event after Consume: %v", err)
	}
	failing := Consume(shippingBase(), placedEvents, func(*Kit) (consumer.HandlerOf[placed], error) { return nil, errors.New("no bank") })
	if _, err := failing.NewHandler(&Kit{}); err == nil || err.Error() != "no bank" {
		t.Errorf("a constructor's error: %v", err)
	}
}

// shippingBase is shippingOptions without a handler or settings.
func shippingBase() Options {
	o := shippingOptions(nil)
	o.Settings, o.Check, o.NewHandler, o.OrderingKey = nil, nil, nil, nil
	return o
}
