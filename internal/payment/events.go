package payment

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit"
)

// The events the payment service emits, through its outbox, to the topic
// exchange ExchangePayments: they leave exactly when the payment's
// transaction commits. Each carries its outbox id as the AMQP message_id,
// stable for every republish: a downstream consumer dedupes on it.
const (
	ExchangePayments   = "payments"
	KeyOrderPaid       = "order.paid"
	KeyPaymentDeclined = "payment.declined"
)

// OrderPaid says that an order's card was charged. Address is where to ship
// it (OrderPlaced's shipping_address; empty if the order had none).
type OrderPaid struct {
	EventID     string    `json:"event_id"`
	OrderID     string    `json:"order_id"`
	CustomerID  string    `json:"customer_id"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	ChargeID    string    `json:"charge_id"`
	Address     string    `json:"address,omitempty"`
	PaidAt      time.Time `json:"paid_at"`
}

// PaymentDeclined says that the card was declined: recorded, nothing to ship.
type PaymentDeclined struct {
	EventID       string    `json:"event_id"`
	OrderID       string    `json:"order_id"`
	CustomerID    string    `json:"customer_id"`
	AmountCents   int64     `json:"amount_cents"`
	Currency      string    `json:"currency"`
	DeclineReason string    `json:"decline_reason"`
	DeclinedAt    time.Time `json:"declined_at"`
}

// emit enqueues the event of a payment just recorded, in its transaction.
// OrderPaid is mandatory (a missing shipping queue parks it rather than
// losing it) and ordered by the order; PaymentDeclined is an announcement
// nobody need subscribe to.
func emit(ctx context.Context, ob *kit.Outbox, tx *gorm.DB, ev orders.OrderPlaced, p Payment) error {
	if ob == nil {
		return nil
	}
	var msg kit.OutboxMessage
	if p.Status == StatusDeclined {
		body, err := json.Marshal(PaymentDeclined{EventID: "payment-declined:" + ev.OrderID, OrderID: ev.OrderID, CustomerID: ev.CustomerID,
			AmountCents: ev.AmountCents, Currency: ev.Currency, DeclineReason: *p.DeclineReason, DeclinedAt: time.Now().UTC()})
		if err != nil {
			return err
		}
		msg = kit.OutboxMessage{Exchange: ExchangePayments, RoutingKey: KeyPaymentDeclined, Body: body, OrderingKey: ev.OrderID, Optional: true}
	} else {
		body, err := json.Marshal(OrderPaid{EventID: "order-paid:" + ev.OrderID, OrderID: ev.OrderID, CustomerID: ev.CustomerID,
			AmountCents: ev.AmountCents, Currency: ev.Currency, ChargeID: p.ChargeID, Address: ev.ShippingAddress, PaidAt: time.Now().UTC()})
		if err != nil {
			return err
		}
		msg = kit.OutboxMessage{Exchange: ExchangePayments, RoutingKey: KeyOrderPaid, Body: body, OrderingKey: ev.OrderID}
	}
	if _, err := ob.Enqueue(ctx, tx, msg); err != nil {
		return fmt.Errorf("emit the event of order %s: %w", ev.OrderID, err)
	}
	return nil
}
