package config

import "time"

// Broker is the RabbitMQ connection and the topology the consumer declares.
type Broker struct {
	AMQPURL          string        `envconfig:"AMQP_URL" default:"amqp://guest:guest@localhost:5672/"`
	Heartbeat        time.Duration `envconfig:"AMQP_HEARTBEAT" default:"10s"`
	Exchange         string        `envconfig:"EXCHANGE" default:"orders"`
	RoutingKey       string        `envconfig:"ROUTING_KEY" default:"order.placed"`
	Queue            string        `envconfig:"QUEUE" default:"payments.order-placed"`
	DeadLetterEx     string        `envconfig:"DEAD_LETTER_EXCHANGE" default:"payments.dlx"`
	DeadLetterQueue  string        `envconfig:"DEAD_LETTER_QUEUE" default:"payments.order-placed.dlq"`
	DeliveryLimit    int           `envconfig:"QUEUE_DELIVERY_LIMIT" default:"20"`
	ReconnectMaxWait time.Duration `envconfig:"RECONNECT_MAX_WAIT" default:"30s"`
}

// Database is a PostgreSQL connection pool.
type Database struct {
	URL              string        `envconfig:"DATABASE_URL" default:"postgres://postgres@localhost:5432/payments?sslmode=disable"`
	MaxConns         int           `envconfig:"DB_MAX_CONNS" default:"10"`
	StatementTimeout time.Duration `envconfig:"DB_STATEMENT_TIMEOUT" default:"5s"`
}

// PaymentService is the configuration of cmd/payment-service.
type PaymentService struct {
	Broker
	Database
	Consumer       string        `envconfig:"CONSUMER_NAME" default:"payment-service"`
	GatewayURL     string        `envconfig:"GATEWAY_URL" default:"http://localhost:8081"`
	GatewayTimeout time.Duration `envconfig:"GATEWAY_TIMEOUT" default:"5s"`
	HTTPAddr       string        `envconfig:"HTTP_ADDR" default:":8080"`
	Prefetch       int           `envconfig:"PREFETCH" default:"192"`
	Workers        int           `envconfig:"WORKERS" default:"128"`
	// DBCommitters transactions commit at once, GroupCommitMax messages at
	// most in each, waiting at most GroupCommitWait for a batch to fill.
	DBCommitters    int             `envconfig:"DB_COMMITTERS" default:"4"`
	GroupCommitMax  int             `envconfig:"GROUP_COMMIT_MAX" default:"32"`
	GroupCommitWait time.Duration   `envconfig:"GROUP_COMMIT_WAIT" default:"2ms"`
	PprofEnabled    bool            `envconfig:"PPROF_ENABLED" default:"false"`
	MaxBodyBytes    int             `envconfig:"MAX_BODY_BYTES" default:"65536"`
	HandlerTimeout  time.Duration   `envconfig:"HANDLER_TIMEOUT" default:"15s"`
	RetryDelays     []time.Duration `envconfig:"RETRY_DELAYS" default:"1s,5s,30s"`
	MaxAttempts     int             `envconfig:"MAX_ATTEMPTS" default:"5"`
	ShutdownTimeout time.Duration   `envconfig:"SHUTDOWN_TIMEOUT" default:"20s"`
	FaultsEnabled   bool            `envconfig:"FAULTS_ENABLED" default:"false"`
	LogLevel        string          `envconfig:"LOG_LEVEL" default:"info"`
	// Inbox rows older than InboxRetention are pruned every InboxPruneInterval
	// (0 disables the pruner), InboxPruneBatch rows per transaction.
	InboxRetention     time.Duration `envconfig:"INBOX_RETENTION" default:"336h"`
	InboxPruneInterval time.Duration `envconfig:"INBOX_PRUNE_INTERVAL" default:"1h"`
	InboxPruneBatch    int           `envconfig:"INBOX_PRUNE_BATCH" default:"1000"`
}

// Validate reports every out-of-range value, naming its variable.
func (c *PaymentService) Validate() error {
	var v checks
	c.Broker.validate(&v)
	c.Database.validate(&v)
	v.url("GATEWAY_URL", c.GatewayURL, "http", "https")
	v.require(c.Consumer != "", "CONSUMER_NAME", "must not be empty")
	v.require(c.GatewayTimeout > 0, "GATEWAY_TIMEOUT", "must be positive, got %s", c.GatewayTimeout)
	v.require(c.Prefetch >= 1 && c.Prefetch <= 1000, "PREFETCH", "must be between 1 and 1000, got %d", c.Prefetch)
	v.require(c.Workers >= 1 && c.Workers <= c.Prefetch, "WORKERS", "must be between 1 and PREFETCH (%d), got %d: raise PREFETCH or lower WORKERS", c.Prefetch, c.Workers)
	v.require(c.DBCommitters >= 1, "DB_COMMITTERS", "must be at least 1, got %d", c.DBCommitters)
	// Each committer holds a connection for its transaction; the inbox
	// look-ups of the workers and the readiness ping need at least one more.
	v.require(c.DBCommitters < c.MaxConns, "DB_MAX_CONNS", "must exceed DB_COMMITTERS (%d) so that look-ups and pings get a connection, got %d: raise DB_MAX_CONNS", c.DBCommitters, c.MaxConns)
	v.require(c.GroupCommitMax >= 1 && c.GroupCommitMax <= 1000, "GROUP_COMMIT_MAX", "must be between 1 (a transaction per message) and 1000, got %d", c.GroupCommitMax)
	v.require(c.GroupCommitWait >= 0 && c.GroupCommitWait <= time.Second, "GROUP_COMMIT_WAIT", "must be between 0 and 1s, got %s", c.GroupCommitWait)
	v.require(c.MaxBodyBytes >= 256, "MAX_BODY_BYTES", "must be at least 256, got %d", c.MaxBodyBytes)
	v.require(c.HandlerTimeout > c.GatewayTimeout, "HANDLER_TIMEOUT", "must exceed GATEWAY_TIMEOUT (%s), got %s", c.GatewayTimeout, c.HandlerTimeout)
	// RabbitMQ closes the channel of a consumer that holds a delivery for longer
	// than consumer_timeout (30 minutes by default); stay far below it.
	v.require(c.HandlerTimeout <= 10*time.Minute, "HANDLER_TIMEOUT", "must be at most 10m (RabbitMQ's consumer_timeout is 30m), got %s", c.HandlerTimeout)
	validateRetries(&v, c.RetryDelays, c.MaxAttempts)
	validateRetention(&v, c.InboxRetention, c.InboxPruneBatch, c.RetryDelays, c.MaxAttempts)
	v.require(c.InboxPruneInterval == 0 || c.InboxPruneInterval >= time.Second, "INBOX_PRUNE_INTERVAL",
		"must be 0 (disabled) or at least 1s, got %s", c.InboxPruneInterval)
	v.require(c.ShutdownTimeout > 0, "SHUTDOWN_TIMEOUT", "must be positive, got %s", c.ShutdownTimeout)
	v.require(validLogLevel(c.LogLevel), "LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	return v.err()
}

func (b *Broker) validate(v *checks) {
	v.url("AMQP_URL", b.AMQPURL, "amqp", "amqps")
	v.require(b.Heartbeat >= time.Second, "AMQP_HEARTBEAT", "must be at least 1s, got %s", b.Heartbeat)
	v.require(b.Exchange != "", "EXCHANGE", "must not be empty")
	v.require(b.Queue != "", "QUEUE", "must not be empty")
	v.require(b.DeadLetterEx != "", "DEAD_LETTER_EXCHANGE", "must not be empty")
	v.require(b.DeadLetterQueue != "", "DEAD_LETTER_QUEUE", "must not be empty")
	v.require(b.DeliveryLimit >= 1, "QUEUE_DELIVERY_LIMIT", "must be at least 1, got %d", b.DeliveryLimit)
	v.require(b.ReconnectMaxWait >= 100*time.Millisecond, "RECONNECT_MAX_WAIT", "must be at least 100ms, got %s", b.ReconnectMaxWait)
}

func (d *Database) validate(v *checks) {
	v.url("DATABASE_URL", d.URL, "postgres", "postgresql")
	v.require(d.MaxConns >= 2, "DB_MAX_CONNS", "must be at least 2, got %d", d.MaxConns)
	v.require(d.StatementTimeout >= 100*time.Millisecond, "DB_STATEMENT_TIMEOUT", "must be at least 100ms, got %s", d.StatementTimeout)
}

func validateRetries(v *checks, delays []time.Duration, maxAttempts int) {
	v.require(len(delays) > 0, "RETRY_DELAYS", "needs at least one delay")
	for _, d := range delays {
		v.require(d >= 10*time.Millisecond && d <= 24*time.Hour, "RETRY_DELAYS", "each delay must be between 10ms and 24h, got %s", d)
	}
	v.require(maxAttempts >= 1 && maxAttempts <= 100, "MAX_ATTEMPTS", "must be between 1 and 100, got %d", maxAttempts)
}

func validLogLevel(s string) bool {
	switch s {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}
