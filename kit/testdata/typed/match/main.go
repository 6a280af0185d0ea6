// Package main is testdata/typed/mismatch with one event type: it compiles,
// so the refusals there are the types' (TestConsumeRefusesAHandlerOfAnotherEvent).
package main

import (
	"context"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/kittest"
)

type OrderPlaced struct{ OrderID string }

type OrderPaid struct{ OrderID string }

type handler struct{}

func (handler) Handle(context.Context, kit.Message, OrderPlaced) (kit.Writes, error) {
	return kit.NoWrites(kit.OutcomeProcessed), nil
}

var placed = kit.Events[OrderPlaced]{Decode: func([]byte) (OrderPlaced, error) { return OrderPlaced{}, nil }}

func main() {
	_ = kit.Consume(kit.Service{Name: "x"}, placed,
		func(*kit.Deps) (kit.Handler[OrderPlaced], error) { return handler{}, nil })
	_ = kit.Consume(kit.Service{Name: "x"}, placed,
		func(*kit.Deps) (kit.Handler[OrderPlaced], error) { return handler{}, nil })
	_ = kit.Consume(kit.Service{Name: "x"}, placed,
		func(*kit.Deps) (handler, error) { return handler{}, nil })
	_, _ = kittest.CheckWrites(nil, nil, placed, handler{}, kit.Message{})
}
