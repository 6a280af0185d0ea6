// Package payment is the reference handler: it charges an OrderPlaced event
// exactly once. It is the part of the template a cloner rewrites; everything it
// needs from the runtime arrives as arguments to Handle and to the writes it
// returns.
package payment

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/inbox-template/payment-service/internal/payment/gateway"
	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/database"
)

// Payment statuses.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// OutcomeDeclined counts a card decline: a business outcome, recorded and acked.
const OutcomeDeclined kit.Outcome = "declined"

// The service's dead-letter reasons and pause cause, declared once: a word
// not of the form of one stops the program as it starts.
var (
	// ReasonOrderConflict dead-letters an order published again with another
	// amount, currency or customer: whether the first is paid or still in
	// flight, the gateway refuses the order's key for another request (422),
	// and a payment already recorded is compared too, in case the gateway
	// forgot the key.
	ReasonOrderConflict = kit.NewReason("order_conflict")
	// ReasonGatewayRejected: the gateway refused the charge request itself.
	ReasonGatewayRejected = kit.NewReason("gateway_rejected")
	// CauseGatewayMisconfigured: the gateway refuses every request alike (a
	// rotated key, a wrong URL): not the message's fault.
	CauseGatewayMisconfigured = kit.NewCause("gateway_misconfigured")
	// decodeReasons are the contract's refusals (orders.Reason*) as reasons.
	decodeReasons = map[string]kit.Reason{}
)

func init() {
	for _, word := range orders.Reasons {
		decodeReasons[word] = kit.NewReason(word)
	}
}

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

// Handler charges each order once, records the payment and emits its event.
type Handler struct {
	gateway Charger
	paid    *database.Lookup[string, Payment] // the read of a recorded payment; writes go through the runtime's tx
	outbox  *kit.Outbox
}

// NewHandler returns a handler that charges through gw, reads the payments
// already recorded through db (read-only transactions), and emits OrderPaid
// or PaymentDeclined through ob with each payment it records (nil emits
// nothing).
func NewHandler(gw Charger, db database.Reader, ob *kit.Outbox) *Handler {
	return &Handler{gateway: gw, paid: database.NewLookup(db, paidLookupMax, readPaid), outbox: ob}
}

// paidLookupMax bounds the orders of one read of recorded payments.
const paidLookupMax = 64

// readPaid reads the recorded payments of orders: one statement for the
// orders the handlers ask about at once (database.Lookup).
func readPaid(_ context.Context, tx *gorm.DB, orderIDs []string) (map[string]Payment, error) {
	var rows []Payment
	if err := tx.Raw(`SELECT order_id, amount_cents, currency, customer_id FROM payments WHERE order_id IN ?`, orderIDs).
		Scan(&rows).Error; err != nil {
		return nil, err
	}
	paid := make(map[string]Payment, len(rows))
	for _, p := range rows {
		paid[p.OrderID] = p
	}
	return paid, nil
}

// DecodeOrder decodes and validates an OrderPlaced body (orders.Decode),
// giving a refused body the reason the contract names. The event comes back
// with the refusal as far as it was read: its event_id names the dead letter
// of a message published without a message_id.
func DecodeOrder(body []byte) (orders.OrderPlaced, error) {
	ev, err := orders.Decode(body)
	var invalid *orders.InvalidError
	if errors.As(err, &invalid) {
		reason, ok := decodeReasons[invalid.Reason]
		if !ok {
			reason = kit.ReasonInvalidEvent // a refusal missing from orders.Reasons; its word stays in err's text
		}
		return ev, kit.Permanent(reason, err)
	}
	return ev, err
}

// IdempotencyKey is derived from the order, never from the message or the
// attempt: every retry, redelivery or republish of one order asks the gateway
// for the same charge, and the gateway replays its first answer.
func IdempotencyKey(orderID string) string { return "order-charge:" + orderID }

// Handle charges the order the event names (decoded once, by the service's
// Events), with no transaction open, then returns the payment insert for the
// runtime to commit with the inbox row.
func (h *Handler) Handle(ctx context.Context, msg kit.Message, ev orders.OrderPlaced) (kit.Writes, error) {
	// The same order under a new message id (a producer retry) is found here
	// once paid, without asking the gateway: a gateway forgets its keys (Stripe
	// after 24 hours) and would charge the card again. A plain read, no lock:
	// one still in flight is caught by the gateway's key and the unique
	// order_id below. The handlers' reads at one moment share one statement.
	paid, found, err := h.paid.Get(ctx, ev.OrderID)
	switch {
	case err != nil:
		return nil, fmt.Errorf("look up payment of order %s: %w", ev.OrderID, err)
	case found:
		if err := conflict(paid, ev); err != nil {
			return nil, err
		}
		return kit.NoWrites(kit.OutcomeDuplicate), nil
	}
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
		return nil, kit.Permanent(ReasonOrderConflict, err)
	case errors.Is(err, gateway.ErrRejected):
		return nil, kit.Permanent(ReasonGatewayRejected, err)
	case errors.Is(err, gateway.ErrMisconfigured):
		return nil, kit.Pause(CauseGatewayMisconfigured, err) // every message alike: not theirs
	case err != nil:
		return nil, err // the client's error names the order
	}
	return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
		return h.record(ctx, tx, msg.ID, ev, charge)
	}, nil
}

// record inserts the payment and, if it is new, emits its event in the same
// transaction. A concurrent transaction inserting the same order makes this
// insert wait on the unique index and then insert nothing: that message is a
// duplicate of the order, not an error, and emits nothing.
func (h *Handler) record(ctx context.Context, tx *gorm.DB, messageID string, ev orders.OrderPlaced, charge gateway.Charge) (kit.Outcome, error) {
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
	}
	if err := emit(ctx, h.outbox, tx, ev, p); err != nil {
		return "", err
	}
	if p.Status == StatusDeclined {
		return OutcomeDeclined, nil
	}
	return kit.OutcomeProcessed, nil
}

// sameOrder decides about an order already paid under another message id: the
// same order again is a duplicate; another amount, currency or customer is a
// conflict, dead-lettered for a person to look at.
func sameOrder(ctx context.Context, tx *gorm.DB, ev orders.OrderPlaced) (kit.Outcome, error) {
	var paid Payment
	if err := tx.WithContext(ctx).Where("order_id = ?", ev.OrderID).Take(&paid).Error; err != nil {
		return "", fmt.Errorf("read payment of order %s: %w", ev.OrderID, err)
	}
	if err := conflict(paid, ev); err != nil {
		return "", err
	}
	return kit.OutcomeDuplicate, nil
}

// conflict dead-letters an event for an order paid with another amount,
// currency or customer.
func conflict(paid Payment, ev orders.OrderPlaced) error {
	if paid.AmountCents == ev.AmountCents && paid.Currency == ev.Currency && paid.CustomerID == ev.CustomerID {
		return nil
	}
	return kit.Permanent(ReasonOrderConflict, fmt.Errorf(
		"order %s was paid as %d %s for customer %s, now published as %d %s for customer %s",
		ev.OrderID, paid.AmountCents, paid.Currency, paid.CustomerID, ev.AmountCents, ev.Currency, ev.CustomerID))
}
