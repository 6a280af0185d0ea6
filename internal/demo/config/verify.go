package config

import "github.com/inbox-template/payment-service/kit"

// Verify is what `inboxctl verify` reads beyond the payment service's own
// configuration: the fake gateway's database, where it looks for double
// charges. `inboxctl migrate gateway` reads it too.
type Verify struct {
	GatewayDatabaseURL string `envconfig:"GATEWAY_DATABASE_URL" default:"postgres://postgres@localhost:5432/gateway?sslmode=disable" desc:"the fake gateway's database, which verify checks for double charges and migrate gateway migrates"`
	// The pipeline's stores: verify checks the chain to the shipments when
	// both are set.
	ShippingDatabaseURL string `envconfig:"SHIPPING_DATABASE_URL" desc:"the shipping service's database: with CARRIER_DATABASE_URL, verify also checks the pipeline (one shipment and one pickup per succeeded payment, each declined payment recorded once by the shipping service, the outbox drained); empty checks the payments only"`
	CarrierDatabaseURL  string `envconfig:"CARRIER_DATABASE_URL" desc:"the fake carrier's database, which verify checks for pickups booked twice (with SHIPPING_DATABASE_URL)"`
	// SummaryDir is where the publisher leaves each run's summary: --run-id
	// finds there what the run sent (duplicates, republishes, poison).
	SummaryDir string `envconfig:"SUMMARY_DIR" desc:"directory of the publisher's run summaries, <run id>.json: order-publisher writes each run's there (beside -summary), inboxctl verify --run-id reads the run's there; empty: none"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *Verify) Validate() error {
	var v kit.Checks
	v.URL("GATEWAY_DATABASE_URL", c.GatewayDatabaseURL, "postgres", "postgresql")
	v.Require((c.ShippingDatabaseURL == "") == (c.CarrierDatabaseURL == ""), "SHIPPING_DATABASE_URL",
		"and CARRIER_DATABASE_URL go together: set both to check the pipeline, or neither")
	if c.ShippingDatabaseURL != "" {
		v.URL("SHIPPING_DATABASE_URL", c.ShippingDatabaseURL, "postgres", "postgresql")
		v.URL("CARRIER_DATABASE_URL", c.CarrierDatabaseURL, "postgres", "postgresql")
	}
	return v.Err()
}
