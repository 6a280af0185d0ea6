package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
)

// The root package's examples (kit/example_test.go) show a service's code;
// this one shows what the runtime does with it.

var reasonMalformedJSON = consumer.NewReason("malformed_json")

type stockCounted struct {
	EventID string `json:"event_id"`
	SKU     string `json:"sku"`
}

type counts struct{}

func (counts) Handle(context.Context, consumer.Message, stockCounted) (consumer.Writes, error) {
	return func(context.Context, *gorm.DB) (consumer.Outcome, error) { return consumer.OutcomeProcessed, nil }, nil
}

// Events describes the event a handler consumes: its decoder, its dedupe key
// for a message without a message_id, its ordering key in the buffered mode.
// The runtime decodes each body once (Decode) and runs the typed handler
// through Typed; a refusal is the message's dead-letter reason.
func ExampleEvents() {
	events := consumer.Events[stockCounted]{
		Decode: func(body []byte) (stockCounted, error) {
			var ev stockCounted
			if err := json.Unmarshal(body, &ev); err != nil {
				return ev, consumer.Permanent(reasonMalformedJSON, err)
			}
			return ev, nil
		},
		ID:          func(e stockCounted) string { return e.EventID },
		OrderingKey: func(e stockCounted) string { return e.SKU },
	}
	msg, err := consumer.Decode(events, consumer.Message{Body: []byte(`{"event_id":"e-1","sku":"sku-9"}`)})
	fmt.Println(msg.ID, err)
	writes, err := consumer.Typed[stockCounted](counts{}).Handle(context.Background(), msg)
	fmt.Println(writes != nil, err)
	_, err = consumer.Decode(events, consumer.Message{Body: []byte(`{"sku":`)})
	fmt.Println(err)
	// Output:
	// e-1 <nil>
	// true <nil>
	// malformed_json: decode: unexpected end of JSON input
}

// NewReason refuses a word that is not a snake_case one by panicking: in a
// package-level var, the program stops as it starts.
func ExampleNewReason() {
	defer func() { fmt.Println(recover()) }()
	_ = consumer.NewReason("Card declined")
	// Output:
	// consumer.NewReason("Card declined"): a reason is a snake_case word (a lowercase letter, then lowercase letters, digits and underscores, 64 bytes at most)
}
