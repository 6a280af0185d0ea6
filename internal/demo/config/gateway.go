package config

import (
	"time"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// Stores of the fake gateway (STORE).
const (
	GatewayStorePostgres = "postgres" // the table charges in DATABASE_URL
	GatewayStoreMemory   = "memory"   // benchmarks only: no database, lost on exit
)

// FakeGateway is the configuration of cmd/fake-gateway.
type FakeGateway struct {
	Store            string        `envconfig:"STORE" default:"postgres" desc:"where charges are kept: postgres (DATABASE_URL) or memory (benchmarks: no database, lost on exit, not seen by inboxctl verify)"`
	DatabaseURL      string        `envconfig:"DATABASE_URL" default:"postgres://postgres@localhost:5432/gateway?sslmode=disable" desc:"PostgreSQL URL of the service's database"`
	StoreMaxConns    int           `envconfig:"STORE_MAX_CONNS" default:"10" desc:"connections to DATABASE_URL at most (STORE=postgres): a charge holds one for a query or two"`
	HTTPAddr         string        `envconfig:"HTTP_ADDR" default:":8081" desc:"listen address of health, metrics and fault endpoints"`
	ErrorRate        float64       `envconfig:"FAULT_ERROR_RATE" default:"0" desc:"probability (0-1) of a 503 before anything is stored"`
	LostResponseRate float64       `envconfig:"FAULT_LOST_RESPONSE_RATE" default:"0" desc:"probability (0-1) of storing the charge, then dropping the connection"`
	Latency          time.Duration `envconfig:"FAULT_LATENCY" default:"0s" desc:"network time of every charge request; a new charge spends it in flight (makes 409 observable)"`
	InFlightTakeover time.Duration `envconfig:"IN_FLIGHT_TAKEOVER" default:"30s" desc:"an in-flight idempotency key older than this is presumed abandoned"`
	KeyTTL           time.Duration `envconfig:"KEY_TTL" default:"0s" desc:"how long a completed idempotency key is remembered, 0 = forever (a real gateway forgets: Stripe after 24h); after it the same key charges again"`
	FaultsEnabled    bool          `envconfig:"FAULTS_ENABLED" default:"false" desc:"serve the fault endpoints (/faults)"`
	FaultsToken      string        `envconfig:"FAULTS_TOKEN" secret:"true" desc:"the bearer token the fault endpoints require (Authorization: Bearer <token>); required with FAULTS_ENABLED unless HTTP_ADDR listens on loopback only"`
	LogLevel         string        `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *FakeGateway) Validate() error {
	var v kit.Checks
	v.Require(c.Store == GatewayStorePostgres || c.Store == GatewayStoreMemory, "STORE",
		"must be %s or %s, got %q", GatewayStorePostgres, GatewayStoreMemory, c.Store)
	if c.Store != GatewayStoreMemory { // the memory store reads no database
		v.URL("DATABASE_URL", c.DatabaseURL, "postgres", "postgresql")
		v.Require(c.StoreMaxConns >= 1 && c.StoreMaxConns <= 100, "STORE_MAX_CONNS", "must be between 1 and 100, got %d", c.StoreMaxConns)
	}
	v.Require(c.HTTPAddr != "", "HTTP_ADDR", "must not be empty")
	v.Require(c.ErrorRate >= 0 && c.ErrorRate <= 1, "FAULT_ERROR_RATE", "must be between 0 and 1, got %v", c.ErrorRate)
	v.Require(c.LostResponseRate >= 0 && c.LostResponseRate <= 1, "FAULT_LOST_RESPONSE_RATE", "must be between 0 and 1, got %v", c.LostResponseRate)
	v.Require(c.Latency >= 0 && c.Latency <= time.Minute, "FAULT_LATENCY", "must be between 0 and 1m, got %s", c.Latency)
	v.Require(c.InFlightTakeover >= time.Second, "IN_FLIGHT_TAKEOVER", "must be at least 1s, got %s", c.InFlightTakeover)
	v.Require(c.KeyTTL >= 0, "KEY_TTL", "must be 0 (forever) or positive, got %s", c.KeyTTL)
	v.FaultsToken(c.FaultsEnabled, c.FaultsToken, c.HTTPAddr)
	v.Require(kit.ValidLogLevel(c.LogLevel), "LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	return v.Err()
}

// Publisher is the configuration of cmd/order-publisher; flags choose the load.
type Publisher struct {
	AMQPURL        string `envconfig:"AMQP_URL" default:"amqp://guest:guest@localhost:5672/" desc:"broker URL, or a cluster's nodes separated by commas (same user and vhost; each reconnect tries them in turn); everything lives in its vhost"`
	Exchange       string `envconfig:"EXCHANGE" default:"orders" desc:"topic exchange the consumed events are published to (no kit default)"`
	RoutingKey     string `envconfig:"ROUTING_KEY" default:"order.placed" desc:"binding key of the work queue (no kit default)"`
	SummaryDir     string `envconfig:"SUMMARY_DIR" desc:"directory of the publisher's run summaries, <run id>.json: order-publisher writes each run's there (beside -summary), inboxctl verify --run-id reads the run's there; empty: none"`
	tracing.Config        // OTEL_*: each publish a span, the root of its order's trace
}

// Validate reports every out-of-range value, naming its variable.
func (c *Publisher) Validate() error {
	var v kit.Checks
	v.AMQPURL("AMQP_URL", c.AMQPURL)
	v.Require(c.Exchange != "", "EXCHANGE", "must not be empty")
	v.Require(c.RoutingKey != "", "ROUTING_KEY", "must not be empty")
	tracing.Check(c.Config, v.Require)
	return v.Err()
}
