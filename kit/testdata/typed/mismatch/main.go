// Package main wires, through the kit's root API, a handler of OrderPaid with
// the Events of OrderPlaced, three ways: through a constructor of the
// Events' type, through one of the handler's, and through one of the
// handler's own type; and runs it through kittest.CheckWrites with those
// Events. None may compile (TestConsumeRefusesAHandlerOfAnotherEvent).
package main

import (
	"context"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/kittest"
)

type OrderPlaced struct{ OrderID string }

type OrderPaid struct{ OrderID string }

type handler struct{}

func (handler) Handle(context.Context, kit.Message, OrderPaid) (kit.Writes, error) {
	return kit.NoWrites(kit.OutcomeProcessed), nil
}

var placed = kit.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }}

func main() {
	_ = kit.Consume(kit.Service{Name: "x"}, placed,
		func(*kit.Deps) (kit.Handler[OrderPlaced], error) { return handler{}, nil })
	_ = kit.Consume(kit.Service{Name: "x"}, placed,
		func(*kit.Deps) (kit.Handler[OrderPaid], error) { return handler{}, nil })
	_ = kit.Consume(kit.Service{Name: "x"}, placed,
		func(*kit.Deps) (handler, error) { return handler{}, nil })
	_, _ = kittest.CheckWrites(nil, nil, placed, handler{}, kit.Message{})
}
