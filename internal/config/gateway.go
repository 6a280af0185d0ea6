package config

import "time"

// Stores of the fake gateway (STORE).
const (
	GatewayStorePostgres = "postgres" // the table charges in DATABASE_URL
	GatewayStoreMemory   = "memory"   // benchmarks only: no database, lost on exit
)

// FakeGateway is the configuration of cmd/fake-gateway.
type FakeGateway struct {
	Store            string        `envconfig:"STORE" default:"postgres"`
	DatabaseURL      string        `envconfig:"DATABASE_URL" default:"postgres://postgres@localhost:5432/gateway?sslmode=disable"`
	HTTPAddr         string        `envconfig:"HTTP_ADDR" default:":8081"`
	ErrorRate        float64       `envconfig:"FAULT_ERROR_RATE" default:"0"`
	LostResponseRate float64       `envconfig:"FAULT_LOST_RESPONSE_RATE" default:"0"`
	Latency          time.Duration `envconfig:"FAULT_LATENCY" default:"0s"`
	InFlightTakeover time.Duration `envconfig:"IN_FLIGHT_TAKEOVER" default:"30s"`
	FaultsEnabled    bool          `envconfig:"FAULTS_ENABLED" default:"false"`
	LogLevel         string        `envconfig:"LOG_LEVEL" default:"info"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *FakeGateway) Validate() error {
	var v checks
	v.require(c.Store == GatewayStorePostgres || c.Store == GatewayStoreMemory, "STORE",
		"must be %s or %s, got %q", GatewayStorePostgres, GatewayStoreMemory, c.Store)
	if c.Store != GatewayStoreMemory { // the memory store reads no database
		v.url("DATABASE_URL", c.DatabaseURL, "postgres", "postgresql")
	}
	v.require(c.HTTPAddr != "", "HTTP_ADDR", "must not be empty")
	v.require(c.ErrorRate >= 0 && c.ErrorRate <= 1, "FAULT_ERROR_RATE", "must be between 0 and 1, got %v", c.ErrorRate)
	v.require(c.LostResponseRate >= 0 && c.LostResponseRate <= 1, "FAULT_LOST_RESPONSE_RATE", "must be between 0 and 1, got %v", c.LostResponseRate)
	v.require(c.Latency >= 0 && c.Latency <= time.Minute, "FAULT_LATENCY", "must be between 0 and 1m, got %s", c.Latency)
	v.require(c.InFlightTakeover >= time.Second, "IN_FLIGHT_TAKEOVER", "must be at least 1s, got %s", c.InFlightTakeover)
	v.require(validLogLevel(c.LogLevel), "LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	return v.err()
}

// Migrate is the configuration of the ops CLI's migrate command.
type Migrate struct {
	Database
}

// Validate reports every out-of-range value, naming its variable.
func (c *Migrate) Validate() error {
	var v checks
	c.Database.validate(&v)
	return v.err()
}

// Publisher is the configuration of cmd/order-publisher; flags choose the load.
type Publisher struct {
	AMQPURL    string `envconfig:"AMQP_URL" default:"amqp://guest:guest@localhost:5672/"`
	Exchange   string `envconfig:"EXCHANGE" default:"orders"`
	RoutingKey string `envconfig:"ROUTING_KEY" default:"order.placed"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *Publisher) Validate() error {
	var v checks
	v.url("AMQP_URL", c.AMQPURL, "amqp", "amqps")
	v.require(c.Exchange != "", "EXCHANGE", "must not be empty")
	v.require(c.RoutingKey != "", "ROUTING_KEY", "must not be empty")
	return v.err()
}
