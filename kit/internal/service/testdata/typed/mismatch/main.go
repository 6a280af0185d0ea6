// Package main wires a handler of OrderPaid with the Events of OrderPlaced,
// three ways: through a constructor of the Events' type, through one of the
// handler's, and through one of the handler's own type. None may compile
// (TestConsumeTypesTheHandlerToItsEvent).
package main

import (
	"context"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/service"
)

type OrderPlaced struct{ OrderID string }

type OrderPaid struct{ OrderID string }

type handler struct{}

func (handler) Handle(context.Context, consumer.Message, OrderPaid) (consumer.Writes, error) {
	return consumer.NoWrites(consumer.OutcomeProcessed), nil
}

func main() {
	_ = service.Consume(service.Options{Name: "x"},
		consumer.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }},
		func(*service.Kit) (consumer.HandlerOf[OrderPlaced], error) { return handler{}, nil })
	_ = service.Consume(service.Options{Name: "x"},
		consumer.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }},
		func(*service.Kit) (consumer.HandlerOf[OrderPaid], error) { return handler{}, nil })
	_ = service.Consume(service.Options{Name: "x"},
		consumer.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }},
		func(*service.Kit) (handler, error) { return handler{}, nil })
}
