// Command bench-kit is the kit with the peers' unit of work: a service on
// the kit's root API whose handler makes no outside call and emits nothing,
// and whose writes are the peers' payment insert, in the inbox transaction.
// Beside the plain consumer it shows what the kit itself costs. It is the
// whole of a service on the kit: its description and one handler.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := kit.Run(ctx, describe(), os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-kit:", err)
		os.Exit(1)
	}
}

// describe is the payment service's names and schema (the bench's topology
// and its metrics' consumer), with a handler of its own that calls nothing
// and emits nothing. The body is decoded once, before the handler, as the
// payment service decodes it.
func describe() kit.Service {
	p := payment.Service()
	return kit.Consume(kit.Service{
		Name: p.Name, Event: p.Event, Exchange: p.Exchange, RoutingKey: p.RoutingKey, Queue: p.Queue,
		DeadLetterExchange: p.DeadLetterExchange, Database: p.Database, Migrations: p.Migrations,
		NoOutsideCalls: true,
		Unordered:      true,
	},
		kit.Events[orders.OrderPlaced]{
			Decode: payment.DecodeOrder,
			ID:     func(o orders.OrderPlaced) string { return o.EventID },
		},
		func(*kit.Deps) (insert, error) { return insert{}, nil })
}

// insert is the handler: the peers' payment insert.
type insert struct{}

func (insert) Handle(_ context.Context, msg kit.Message, o orders.OrderPlaced) (kit.Writes, error) {
	return func(_ context.Context, tx *gorm.DB) (kit.Outcome, error) {
		res := tx.Exec(`INSERT INTO payments (order_id, message_id, customer_id, amount_cents, currency, status, charge_id)
			VALUES (?, ?, ?, ?, ?, 'succeeded', ?) ON CONFLICT (order_id) DO NOTHING`,
			o.OrderID, msg.ID, o.CustomerID, o.AmountCents, o.Currency, "ch_"+o.OrderID)
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0:
			return kit.OutcomeDuplicate, nil
		}
		return kit.OutcomeProcessed, nil
	}, nil
}
