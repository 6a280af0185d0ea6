// Package main wires a handler with the Events of its own event, through a
// constructor of the interface and one of the handler's own type: it
// compiles (TestConsumeTypesTheHandlerToItsEvent).
package main

import (
	"context"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/service"
)

type OrderPlaced struct{ OrderID string }

type handler struct{}

func (handler) Handle(context.Context, consumer.Message, OrderPlaced) (consumer.Writes, error) {
	return consumer.NoWrites(consumer.OutcomeProcessed), nil
}

func main() {
	_ = service.Consume(service.Options{Name: "x"},
		consumer.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }},
		func(*service.Kit) (consumer.HandlerOf[OrderPlaced], error) { return handler{}, nil })
	_ = service.Consume(service.Options{Name: "x"},
		consumer.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }},
		func(*service.Kit) (*handler, error) { return &handler{}, nil })
}
