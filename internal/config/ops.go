package config

import (
	"time"

	"github.com/inbox-template/payment-service/internal/retention"
)

// DeadLetterOps is the configuration of `inboxctl dlq`: the broker and the
// names of the service's work and dead-letter queues.
type DeadLetterOps struct {
	Broker
}

// Validate reports every out-of-range value, naming its variable.
func (c *DeadLetterOps) Validate() error {
	var v checks
	c.Broker.validate(&v)
	return v.err()
}

// InboxPrune is the configuration of `inboxctl inbox prune`. It reads the
// service's own variables, so that the command and the scheduled pruner agree
// on the consumer, the window and the redelivery horizon that bounds it.
type InboxPrune struct {
	Database
	Consumer    string          `envconfig:"CONSUMER_NAME" default:"payment-service"`
	Retention   time.Duration   `envconfig:"INBOX_RETENTION" default:"336h"`
	Batch       int             `envconfig:"INBOX_PRUNE_BATCH" default:"1000"`
	RetryDelays []time.Duration `envconfig:"RETRY_DELAYS" default:"1s,5s,30s"`
	MaxAttempts int             `envconfig:"MAX_ATTEMPTS" default:"5"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *InboxPrune) Validate() error {
	var v checks
	c.Database.validate(&v)
	v.require(c.Consumer != "", "CONSUMER_NAME", "must not be empty")
	validateRetries(&v, c.RetryDelays, c.MaxAttempts)
	validateRetention(&v, c.Retention, c.Batch, c.RetryDelays, c.MaxAttempts)
	return v.err()
}

// validateRetention checks the inbox window against the broker's redelivery
// horizon (see retention.MinWindow): a row pruned while its message can still
// be redelivered would let the redelivery be applied a second time.
func validateRetention(v *checks, window time.Duration, batch int, delays []time.Duration, maxAttempts int) {
	floor := retention.MinWindow(delays, maxAttempts)
	v.require(window >= floor, "INBOX_RETENTION",
		"must be at least %s, the redelivery horizon of RETRY_DELAYS=%s and MAX_ATTEMPTS=%d (%s), got %s",
		floor, durations(delays), maxAttempts, retention.MinWindowRule, window)
	v.require(batch >= 1 && batch <= retention.MaxBatchSize, "INBOX_PRUNE_BATCH",
		"must be between 1 and %d, got %d", retention.MaxBatchSize, batch)
}

func durations(ds []time.Duration) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += ","
		}
		s += d.String()
	}
	return s
}
