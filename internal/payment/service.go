package payment

import (
	"context"
	"time"

	"github.com/inbox-template/payment-service/internal/payment/gateway"
	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit"
)

// Settings are the payment handler's own: the gateway it charges through.
type Settings struct {
	GatewayURL     string        `envconfig:"GATEWAY_URL" default:"http://localhost:8081" desc:"base URL of the payment gateway"`
	GatewayTimeout time.Duration `envconfig:"GATEWAY_TIMEOUT" default:"5s" desc:"timeout of one gateway call; below HANDLER_TIMEOUT"`
	// GatewayInFlightTimeout is the gateway's, not ours: how long it answers
	// 409 for a key whose first request it lost in flight before it lets a
	// retry execute the charge (the fake gateway's IN_FLIGHT_TAKEOVER).
	GatewayInFlightTimeout time.Duration `envconfig:"GATEWAY_IN_FLIGHT_TIMEOUT" default:"30s" desc:"how long the gateway keeps a key in flight (409) after losing its request (the fake gateway's IN_FLIGHT_TAKEOVER); the retries must outlast it"`
}

// AfterGatewayCharge is the payment service's own crash point: the card is
// charged, nothing of the message is committed yet.
const AfterGatewayCharge kit.CrashPoint = "after-gateway-charge"

// Events is how the payment service reads OrderPlaced: each body is decoded
// once, a message without a message_id property is deduped by its event_id,
// and the buffered mode processes the events of one order one at a time.
// The handler is typed to the same event: one of another would not compile,
// in Service as in kittest.CheckWrites.
var Events = kit.Events[orders.OrderPlaced]{
	Decode:      DecodeOrder,
	ID:          func(e orders.OrderPlaced) string { return e.EventID },
	OrderingKey: func(e orders.OrderPlaced) string { return e.OrderID },
}

// Service describes the payment service to the kit: it consumes OrderPlaced
// from the orders exchange under the names it was released with.
func Service() kit.Service {
	return kit.ConsumeWithSettings(kit.Service{
		Name:               "payment-service",
		Event:              "order-placed",
		Exchange:           "orders",
		RoutingKey:         "order.placed",
		Queue:              "payments.order-placed",
		DeadLetterExchange: "payments.dlx",
		Database:           "payments",
		Migrations:         []kit.MigrationSet{Migrations},
		// OrderPaid and PaymentDeclined leave through the outbox (events.go).
		Publishes: []string{ExchangePayments},
		// Read from the body as it is: a dead letter's log lines and `dlq
		// list` name its order even when it is not a valid OrderPlaced.
		LogAttrs: kit.JSONAttrs("order_id"),
	},
		Events,
		func(k *kit.Deps, s *Settings) (kit.Handler[orders.OrderPlaced], error) {
			// One keep-alive connection per worker: each may be in a gateway call.
			client := gateway.NewClient(s.GatewayURL, s.GatewayTimeout, k.Config.Workers)
			// A span under the message's, and the crash point right after it.
			charge := kit.OutsideCall(k, "gateway charge", AfterGatewayCharge, client.Charge)
			return NewHandler(chargeFunc(charge), k.Reader, k.Outbox), nil
		})
}

// Check validates the settings against each other and the kit's.
func (s *Settings) Check(cfg *kit.Config, v *kit.Checks) {
	v.URL("GATEWAY_URL", s.GatewayURL, "http", "https")
	v.Require(s.GatewayTimeout > 0 && s.GatewayTimeout < cfg.HandlerTimeout, "GATEWAY_TIMEOUT",
		"must be positive and below HANDLER_TIMEOUT (%s), got %s", cfg.HandlerTimeout, s.GatewayTimeout)
	// A charge lost in flight answers 409 until the gateway's window ends.
	v.InFlightWindow("GATEWAY_IN_FLIGHT_TIMEOUT", s.GatewayInFlightTimeout, cfg, "a charge", "the gateway")
}

// chargeFunc adapts a function to Charger.
type chargeFunc func(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error)

func (f chargeFunc) Charge(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error) {
	return f(ctx, req)
}
