// Command bench-kit is the kit with the peers' unit of work: a service on
// kit/service whose handler makes no outside call and emits nothing,
// and whose writes are the peers' payment insert, in the inbox transaction.
// Beside the plain consumer it shows what the kit itself costs. It is the
// whole of a service on the kit: its Options and one handler.
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
	"github.com/inbox-template/payment-service/kit/consumer"
	"github.com/inbox-template/payment-service/kit/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := service.Run(ctx, options(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-kit:", err)
		os.Exit(1)
	}
}

// options are the payment service's names and schema (the bench's topology
// and its metrics' consumer), with a handler of its own that calls nothing
// and emits nothing.
func options() service.Options {
	p := payment.Service()
	return service.Options{
		Name: p.Name, Event: p.Event, Exchange: p.Exchange, RoutingKey: p.RoutingKey, Queue: p.Queue,
		DeadLetterExchange: p.DeadLetterExchange, Database: p.Database, Migrations: p.Migrations,
		NoOutsideCalls: true,
		Unordered:      true,
		NewHandler: func(*service.Kit) (consumer.Handler, error) {
			return consumer.HandlerFunc(handle), nil
		},
	}
}

// handle decodes the order and returns the peers' payment insert.
func handle(_ context.Context, msg consumer.Message) (consumer.Writes, error) {
	o, err := orders.Decode(msg.Body)
	if err != nil {
		return nil, consumer.Permanent(consumer.ReasonInvalidEvent, err)
	}
	return func(_ context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		res := tx.Exec(`INSERT INTO payments (order_id, message_id, customer_id, amount_cents, currency, status, charge_id)
			VALUES (?, ?, ?, ?, ?, 'succeeded', ?) ON CONFLICT (order_id) DO NOTHING`,
			o.OrderID, msg.ID, o.CustomerID, o.AmountCents, o.Currency, "ch_"+o.OrderID)
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0:
			return consumer.OutcomeDuplicate, nil
		}
		return consumer.OutcomeProcessed, nil
	}, nil
}
