// Package payment is the reference handler: it charges an OrderPlaced event
// exactly once. It is the part of the template a cloner rewrites; everything it
// needs from the runtime arrives as arguments to Handle and to the writes it
// returns.
package payment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/inbox-template/payment-service/internal/consumer"
	"github.com/inbox-template/payment-service/internal/gateway"
	"github.com/inbox-template/payment-service/internal/orders"
)

// Payment statuses.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// OutcomeDeclined counts a card decline: a business outcome, recorded and acked.
const OutcomeDeclined consumer.Outcome = "declined"

// ReasonOrderConflict dead-letters an order published again with another
// amount, currency or customer: whether the first is paid or still in flight,
// the gateway refuses the order's key for another request (422), and a payment
// already recorded is compared too, in case the gateway forgot the key.
const ReasonOrderConflict = "order_conflict"

// Payment is one row of the payments table: the result of charging one order.
type Payment struct {
	ID            int64     `gorm:"column:id;primaryKey"`
	OrderID       string    `gorm:"column:order_id;not null;uniqueIndex"`
	MessageID     string    `gorm:"column:message_id;not null"`
	CustomerID    string    `gorm:"column:customer_id;not null"`
	AmountCents   int64     `gorm:"column:amount_cents;not null"`
	Currency      string    `gorm:"column:currency;not null"`
	Status        string    `gorm:"column:status;not null"`
	ChargeID      string    `gorm:"column:charge_id;not null"`
	DeclineReason *string   `gorm:"column:decline_reason"`
	CreatedAt     time.Time `gorm:"column:created_at;not null;default:now()"`
}

// TableName is the table of the versioned migrations.
func (Payment) TableName() string { return "payments" }

// Charger charges a card through the payment gateway.
type Charger interface {
	Charge(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error)
}

// Handler charges each order once and records the payment.
type Handler struct {
	gateway Charger
}

// NewHandler returns a handler that charges through gw.
func NewHandler(gw Charger) *Handler {
	return &Handler{gateway: gw}
}

// IdempotencyKey is derived from the order, never from the message or the
// attempt: every retry, redelivery or republish of one order asks the gateway
// for the same charge, and the gateway replays its first answer.
func IdempotencyKey(orderID string) string { return "order-charge:" + orderID }

// Handle validates the event and charges the order, with no transaction open,
// then returns the payment insert for the runtime to commit with the inbox row.
func (h *Handler) Handle(ctx context.Context, msg consumer.Message) (consumer.Writes, error) {
	ev, err := orders.Decode(msg.Body)
	if err != nil {
		var invalid *orders.InvalidError
		if errors.As(err, &invalid) {
			return nil, consumer.Permanent(invalid.Reason, err)
		}
		return nil, consumer.Permanent("invalid_event", err)
	}
	// The same order under a new message id (a producer retry) asks for the
	// same charge: the gateway replays it, and the unique order_id below makes
	// the message a duplicate.
	charge, err := h.gateway.Charge(ctx, gateway.ChargeRequest{
		IdempotencyKey: IdempotencyKey(ev.OrderID),
		OrderID:        ev.OrderID,
		CustomerID:     ev.CustomerID,
		AmountCents:    ev.AmountCents,
		Currency:       ev.Currency,
	})
	switch {
	case errors.Is(err, gateway.ErrKeyReused):
		// The order's key was charged for another amount, currency or customer.
		return nil, consumer.Permanent(ReasonOrderConflict, err)
	case errors.Is(err, gateway.ErrRejected):
		return nil, consumer.Permanent("gateway_rejected", err)
	case errors.Is(err, gateway.ErrMisconfigured):
		return nil, consumer.Pause("gateway_misconfigured", err) // every message alike: not theirs
	case err != nil:
		return nil, err // the client's error names the order
	}
	return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		return record(ctx, tx, msg.ID, ev, charge)
	}, nil
}

// record inserts the payment. A concurrent transaction inserting the same order
// makes this insert wait on the unique index and then insert nothing: that
// message is a duplicate of the order, not an error.
func record(ctx context.Context, tx *gorm.DB, messageID string, ev orders.OrderPlaced, charge gateway.Charge) (consumer.Outcome, error) {
	p := Payment{
		OrderID:     ev.OrderID,
		MessageID:   messageID,
		CustomerID:  ev.CustomerID,
		AmountCents: ev.AmountCents,
		Currency:    ev.Currency,
		Status:      charge.Status,
		ChargeID:    charge.ID,
	}
	if charge.Status == StatusDeclined {
		p.DeclineReason = &charge.DeclineReason
	}
	res := tx.WithContext(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "order_id"}}, DoNothing: true}).Create(&p)
	switch {
	case res.Error != nil:
		return "", fmt.Errorf("insert payment of order %s: %w", ev.OrderID, res.Error)
	case res.RowsAffected == 0:
		return sameOrder(ctx, tx, ev)
	case p.Status == StatusDeclined:
		return OutcomeDeclined, nil
	}
	return consumer.OutcomeProcessed, nil
}

// sameOrder decides about an order already paid under another message id: the
// same order again is a duplicate; another amount, currency or customer is a
// conflict, dead-lettered for a person to look at.
func sameOrder(ctx context.Context, tx *gorm.DB, ev orders.OrderPlaced) (consumer.Outcome, error) {
	var paid Payment
	if err := tx.WithContext(ctx).Where("order_id = ?", ev.OrderID).Take(&paid).Error; err != nil {
		return "", fmt.Errorf("read payment of order %s: %w", ev.OrderID, err)
	}
	if paid.AmountCents != ev.AmountCents || paid.Currency != ev.Currency || paid.CustomerID != ev.CustomerID {
		return "", consumer.Permanent(ReasonOrderConflict, fmt.Errorf(
			"order %s was paid as %d %s for customer %s, now published as %d %s for customer %s",
			ev.OrderID, paid.AmountCents, paid.Currency, paid.CustomerID, ev.AmountCents, ev.Currency, ev.CustomerID))
	}
	return consumer.OutcomeDuplicate, nil
}

// EventID finds the event_id of a body, for producers that set no AMQP
// message_id. It returns "" for anything it cannot read.
func EventID(body []byte) string {
	var v struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return v.EventID
}

// LogAttrs puts the order id on every log line about a message.
func LogAttrs(body []byte) []slog.Attr {
	var v struct {
		OrderID string `json:"order_id"`
	}
	if json.Unmarshal(body, &v) != nil || v.OrderID == "" {
		return nil
	}
	return []slog.Attr{slog.String("order_id", v.OrderID)}
}
