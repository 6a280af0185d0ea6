package config

import "time"

// Verify is the configuration of `inboxctl verify`: the service's broker names,
// its payments database and the fake gateway's database.
type Verify struct {
	Broker
	Database
	GatewayDatabaseURL string          `envconfig:"GATEWAY_DATABASE_URL" default:"postgres://postgres@localhost:5432/gateway?sslmode=disable"`
	RetryDelays        []time.Duration `envconfig:"RETRY_DELAYS" default:"1s,5s,30s"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *Verify) Validate() error {
	var v checks
	c.Broker.validate(&v)
	c.Database.validate(&v)
	v.url("GATEWAY_DATABASE_URL", c.GatewayDatabaseURL, "postgres", "postgresql")
	v.require(len(c.RetryDelays) > 0, "RETRY_DELAYS", "needs at least one delay")
	return v.err()
}
