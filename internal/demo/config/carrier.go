package config

import (
	"time"

	"github.com/inbox-template/payment-service/kit"
)

// FakeCarrier is the configuration of cmd/fake-carrier, the shipping
// service's carrier in the demo pipeline.
type FakeCarrier struct {
	DatabaseURL      string        `envconfig:"DATABASE_URL" default:"postgres://postgres@localhost:5432/carrier?sslmode=disable" desc:"PostgreSQL URL of the service's database"`
	HTTPAddr         string        `envconfig:"HTTP_ADDR" default:":8082" desc:"listen address of health, metrics and fault endpoints"`
	ErrorRate        float64       `envconfig:"CARRIER_FAULT_ERROR_RATE" default:"0" desc:"fake carrier: probability (0-1) of a 503 before anything is stored"`
	LostResponseRate float64       `envconfig:"CARRIER_FAULT_LOST_RESPONSE_RATE" default:"0" desc:"fake carrier: probability (0-1) of storing the booking, then dropping the connection"`
	Latency          time.Duration `envconfig:"CARRIER_FAULT_LATENCY" default:"0s" desc:"fake carrier: network time of every booking; a new booking spends it in flight (makes 409 observable)"`
	InFlightTakeover time.Duration `envconfig:"CARRIER_IN_FLIGHT_TAKEOVER" default:"30s" desc:"fake carrier: an in-flight idempotency key older than this is presumed abandoned"`
	FaultsEnabled    bool          `envconfig:"FAULTS_ENABLED" default:"false" desc:"serve the fault endpoints (/faults)"`
	FaultsToken      string        `envconfig:"FAULTS_TOKEN" secret:"true" desc:"the bearer token the fault endpoints require (Authorization: Bearer <token>); required with FAULTS_ENABLED unless HTTP_ADDR listens on loopback only"`
	LogLevel         string        `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *FakeCarrier) Validate() error {
	var v kit.Checks
	v.URL("DATABASE_URL", c.DatabaseURL, "postgres", "postgresql")
	v.Require(c.HTTPAddr != "", "HTTP_ADDR", "must not be empty")
	v.FaultsToken(c.FaultsEnabled, c.FaultsToken, c.HTTPAddr)
	v.Require(c.ErrorRate >= 0 && c.ErrorRate <= 1, "CARRIER_FAULT_ERROR_RATE", "must be between 0 and 1, got %v", c.ErrorRate)
	v.Require(c.LostResponseRate >= 0 && c.LostResponseRate <= 1, "CARRIER_FAULT_LOST_RESPONSE_RATE", "must be between 0 and 1, got %v", c.LostResponseRate)
	v.Require(c.Latency >= 0 && c.Latency <= time.Minute, "CARRIER_FAULT_LATENCY", "must be between 0 and 1m, got %s", c.Latency)
	v.Require(c.InFlightTakeover >= time.Second, "CARRIER_IN_FLIGHT_TAKEOVER", "must be at least 1s, got %s", c.InFlightTakeover)
	v.Require(kit.ValidLogLevel(c.LogLevel), "LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	return v.Err()
}
