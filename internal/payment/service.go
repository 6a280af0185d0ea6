package payment

import (
	"context"
	"time"

	"github.com/inbox-template/payment-service/internal/consumer"
	"github.com/inbox-template/payment-service/internal/faults"
	"github.com/inbox-template/payment-service/internal/gateway"
	"github.com/inbox-template/payment-service/internal/migrations"
	"github.com/inbox-template/payment-service/internal/service"
)

// Settings are the payment handler's own: the gateway it charges through.
type Settings struct {
	GatewayURL     string        `envconfig:"GATEWAY_URL" default:"http://localhost:8081" desc:"base URL of the payment gateway"`
	GatewayTimeout time.Duration `envconfig:"GATEWAY_TIMEOUT" default:"5s" desc:"timeout of one gateway call; below HANDLER_TIMEOUT"`
}

// AfterGatewayCharge is the payment service's own crash point: the card is
// charged, nothing of the message is committed yet.
const AfterGatewayCharge faults.Point = "after-gateway-charge"

// Service describes the payment service to the kit: it consumes OrderPlaced
// from the orders exchange under the names it was released with.
func Service() service.Options {
	var s Settings
	return service.Options{
		Name:               "payment-service",
		Event:              "order-placed",
		Exchange:           "orders",
		RoutingKey:         "order.placed",
		Queue:              "payments.order-placed",
		DeadLetterExchange: "payments.dlx",
		Database:           "payments",
		Settings:           &s,
		Check: func(cfg *service.Config, v *service.Checks) {
			v.URL("GATEWAY_URL", s.GatewayURL, "http", "https")
			v.Require(s.GatewayTimeout > 0 && s.GatewayTimeout < cfg.HandlerTimeout, "GATEWAY_TIMEOUT",
				"must be positive and below HANDLER_TIMEOUT (%s), got %s", cfg.HandlerTimeout, s.GatewayTimeout)
		},
		Migrations: []migrations.Set{Migrations},
		NewHandler: func(k *service.Kit) (consumer.Handler, error) {
			// One keep-alive connection per worker: each may be in a gateway call.
			client := gateway.NewClient(s.GatewayURL, s.GatewayTimeout, k.Config.Workers)
			return NewHandler(chargeFunc(faults.After(k.Crasher, AfterGatewayCharge, client.Charge))), nil
		},
		KeyFromBody: EventID,
		LogAttrs:    LogAttrs,
	}
}

// chargeFunc adapts a function to Charger.
type chargeFunc func(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error)

func (f chargeFunc) Charge(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error) {
	return f(ctx, req)
}
