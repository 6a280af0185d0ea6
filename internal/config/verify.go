package config

import "github.com/inbox-template/payment-service/internal/service"

// Verify is what `inboxctl verify` reads beyond the payment service's own
// configuration: the fake gateway's database, where it looks for double
// charges. `inboxctl migrate gateway` reads it too.
type Verify struct {
	GatewayDatabaseURL string `envconfig:"GATEWAY_DATABASE_URL" default:"postgres://postgres@localhost:5432/gateway?sslmode=disable" desc:"the fake gateway's database, which verify checks for double charges and migrate gateway migrates"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *Verify) Validate() error {
	var v service.Checks
	v.URL("GATEWAY_DATABASE_URL", c.GatewayDatabaseURL, "postgres", "postgresql")
	return v.Err()
}
