// Package shipping is the example consumer of docs/writing-a-service.md: it
// books a carrier pickup for each OrderPaid event and records the shipment,
// exactly once, and records each PaymentDeclined order as one it will not
// ship. It is two handlers, their events, a carrier client and migrations;
// the kit (the root package kit) does the rest.
package shipping

import (
	"context"
	"embed"
	"encoding/json"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/inbox-template/payment-service/kit"
)

// OrderPaid is the event this service consumes.
type OrderPaid struct {
	EventID string `json:"event_id"`
	OrderID string `json:"order_id"`
	Address string `json:"address"`
}

// Shipment is one row of the shipments table.
type Shipment struct {
	OrderID   string `gorm:"primaryKey"`
	MessageID string
	PickupID  string
}

// The service's dead-letter reasons, declared once: a word not of the form of
// one stops the program as it starts.
var (
	ReasonMalformedJSON   = kit.NewReason("malformed_json")
	ReasonMissingField    = kit.NewReason("missing_field")
	ReasonCarrierRejected = kit.NewReason("carrier_rejected")
)

// DecodeOrderPaid decodes and validates a body; a refused one is
// dead-lettered with the reason given here, before any handler runs.
func DecodeOrderPaid(body []byte) (OrderPaid, error) {
	var ev OrderPaid
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, kit.Permanent(ReasonMalformedJSON, err)
	}
	if ev.OrderID == "" || ev.Address == "" {
		return ev, kit.Permanent(ReasonMissingField, nil)
	}
	return ev, nil
}

// Handler books a pickup for each paid order and records the shipment.
type Handler struct {
	book func(ctx context.Context, req Pickup) (string, error)
}

// Handle books the pickup of the paid order (the event, decoded once by
// Events) with no transaction open, then returns the shipment
// insert for the runtime to commit with the inbox row.
func (h *Handler) Handle(ctx context.Context, msg kit.Message, ev OrderPaid) (kit.Writes, error) {
	// The idempotency key is the order's: a redelivery books the same pickup.
	pickupID, err := h.book(ctx, Pickup{Key: "pickup:" + ev.OrderID, OrderID: ev.OrderID, Address: ev.Address})
	if err != nil {
		return nil, err // retried with backoff, then dead-lettered
	}
	return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).
			Create(&Shipment{OrderID: ev.OrderID, MessageID: msg.ID, PickupID: pickupID})
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0: // the same order under another message id
			return kit.OutcomeDuplicate, nil
		}
		return kit.OutcomeProcessed, nil
	}, nil
}

// PaymentDeclined is the service's second event, which the payment service
// emits for a declined card: nothing to ship.
type PaymentDeclined struct {
	EventID       string `json:"event_id"`
	OrderID       string `json:"order_id"`
	DeclineReason string `json:"decline_reason"`
}

// DecodePaymentDeclined decodes and validates a body, as DecodeOrderPaid.
func DecodePaymentDeclined(body []byte) (PaymentDeclined, error) {
	var ev PaymentDeclined
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, kit.Permanent(ReasonMalformedJSON, err)
	}
	if ev.OrderID == "" {
		return ev, kit.Permanent(ReasonMissingField, nil)
	}
	return ev, nil
}

// Declined is one row of the declined_orders table.
type Declined struct {
	OrderID   string `gorm:"primaryKey"`
	MessageID string
	Reason    string
}

// TableName is the table of the migration.
func (Declined) TableName() string { return "declined_orders" }

// DeclinedHandler records each declined order once: no outside call.
type DeclinedHandler struct{}

// Handle returns the insert of the declined order.
func (DeclinedHandler) Handle(ctx context.Context, msg kit.Message, ev PaymentDeclined) (kit.Writes, error) {
	return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).
			Create(&Declined{OrderID: ev.OrderID, MessageID: msg.ID, Reason: ev.DeclineReason})
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0: // the same order under another message id
			return kit.OutcomeDuplicate, nil
		}
		return kit.OutcomeProcessed, nil
	}, nil
}

// Settings are the handler's own.
type Settings struct {
	CarrierURL     string        `envconfig:"CARRIER_URL" default:"http://localhost:8082" desc:"base URL of the carrier's pickup API"`
	CarrierTimeout time.Duration `envconfig:"CARRIER_TIMEOUT" default:"5s" desc:"timeout of one booking; below HANDLER_TIMEOUT"`
	// CarrierInFlightTimeout is the carrier's, not ours: how long it answers
	// 409 for a key whose first request it lost in flight before it lets a
	// retry book (the fake carrier's CARRIER_IN_FLIGHT_TAKEOVER).
	CarrierInFlightTimeout time.Duration `envconfig:"CARRIER_IN_FLIGHT_TIMEOUT" default:"30s" desc:"how long the carrier keeps a key in flight (409) after losing its request (the fake carrier's CARRIER_IN_FLIGHT_TAKEOVER); the retries must outlast it"`
}

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Events is how the shipping service reads OrderPaid: each body is decoded
// once; in the buffered mode, one order's events are processed in order.
// The handler is typed to the same event: one of another would not compile,
// in Service as in kittest.CheckWrites.
var Events = kit.Events[OrderPaid]{
	Decode:      DecodeOrderPaid,
	OrderingKey: func(e OrderPaid) string { return e.OrderID },
}

// DeclinedEvents is how it reads PaymentDeclined: ordered by the same key,
// so that in the buffered mode one order's events, of either kind, are
// processed in the order they were stored.
var DeclinedEvents = kit.Events[PaymentDeclined]{
	Decode:      DecodePaymentDeclined,
	OrderingKey: func(e PaymentDeclined) string { return e.OrderID },
}

// Service describes the shipping service to the kit. Its queues are derived:
// shipping-service.order-paid, shipping-service.dlx, ….
func Service() kit.Service {
	svc := kit.ConsumeWithSettings(kit.Service{
		Name:       "shipping-service",
		Event:      "order-paid",
		Exchange:   "payments",
		RoutingKey: "order.paid",
		Migrations: []kit.MigrationSet{kit.Migrations("shipping", migrationFiles, "migrations")},
		LogAttrs:   kit.JSONAttrs("order_id"),
	},
		Events,
		func(d *kit.Deps, s *Settings) (kit.Handler[OrderPaid], error) {
			carrier := NewCarrier(s.CarrierURL, s.CarrierTimeout, d.Config.Workers)
			// A span under the message's, and the crash point right after it.
			return &Handler{book: kit.OutsideCall(d, "carrier book", "after-carrier-book", carrier.Book)}, nil
		})
	// Its second event, on a binding of its own (the work queue's exchange,
	// payments), in the same inbox and queues.
	return kit.ConsumeAlso(svc, kit.Binding{Key: "payment.declined"}, DeclinedEvents,
		func(d *kit.Deps) (kit.Handler[PaymentDeclined], error) { return DeclinedHandler{}, nil })
}

// Check validates the settings against the kit's configuration.
func (s *Settings) Check(cfg *kit.Config, v *kit.Checks) {
	v.URL("CARRIER_URL", s.CarrierURL, "http", "https")
	v.Require(s.CarrierTimeout > 0 && s.CarrierTimeout < cfg.HandlerTimeout, "CARRIER_TIMEOUT",
		"must be positive and below HANDLER_TIMEOUT (%s), got %s", cfg.HandlerTimeout, s.CarrierTimeout)
	// A booking whose answer timed out may still be in flight at the
	// carrier: its retries meet 409 until it completes or the carrier's
	// window ends, and must not all be spent meanwhile.
	v.InFlightWindow("CARRIER_IN_FLIGHT_TIMEOUT", s.CarrierInFlightTimeout, cfg, "a booking", "the carrier")
}
