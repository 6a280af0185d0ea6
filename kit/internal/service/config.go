package service

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/retention"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// Config is every setting the kit reads from the environment. Names with no
// default here (the queues, what to consume, the database URL, the consumer
// label) come from Options: derived from the service's name and event, or set
// by the service; each variable still overrides. The runtime's settings with
// no default tag default to the runtime's own defaults (consumer.Defaults,
// consumer.BufferedDefaults, outbox.RelayDefaults), the one place they are
// written: `env` and .env.example show them.
type Config struct {
	Broker
	Database
	Consumer           string          `envconfig:"CONSUMER_NAME" desc:"the inbox.consumer column and the metrics' consumer label (default the service name)"`
	HTTPAddr           string          `envconfig:"HTTP_ADDR" default:":8080" desc:"listen address of health, metrics and fault endpoints"`
	Prefetch           int             `envconfig:"PREFETCH" desc:"unacked deliveries held at most (1-1000)"`
	Workers            int             `envconfig:"WORKERS" desc:"concurrent handlers (1-PREFETCH); an outside call holds no database connection, so this can be far above DB_MAX_CONNS"`
	DBCommitters       int             `envconfig:"DB_COMMITTERS" desc:"transactions committing at once, each on one pooled connection (below DB_MAX_CONNS)"`
	GroupCommitMax     int             `envconfig:"GROUP_COMMIT_MAX" desc:"messages committed together in one transaction, a savepoint each; 1 = a transaction per message"`
	GroupCommitWait    time.Duration   `envconfig:"GROUP_COMMIT_WAIT" desc:"how long a commit waits for more messages to join it (0-1s)"`
	MaxBodyBytes       int             `envconfig:"MAX_BODY_BYTES" desc:"larger bodies are dead-lettered unread"`
	HandlerTimeout     time.Duration   `envconfig:"HANDLER_TIMEOUT" default:"15s" desc:"timeout of one handler run, outside calls included; at most 10m (RabbitMQ's consumer ack timeout is 30 min)"`
	RetryDelays        []time.Duration `envconfig:"RETRY_DELAYS" desc:"delay before retry n, comma-separated; the last one repeats"`
	MaxAttempts        int             `envconfig:"MAX_ATTEMPTS" desc:"handler runs of one message, the first included"`
	PauseAfterFailures int             `envconfig:"PAUSE_AFTER_FAILURES" desc:"pause consuming once this many distinct messages (at least 2) failed in the handler in a row (a dependency down for every message) instead of spending their retries; below that, a message at its last attempt is dead-lettered all the same; from then until a success, a failing message is put back whatever attempts it spent; -1 never"`
	MaxHolds           int             `envconfig:"MAX_HOLDS" desc:"times one message may be put back, without spending an attempt, by a pause its handler asked for (kit.Pause); its next such pause is taken for its own fault: dead-lettered (buffered: parked) held_too_often (1-10000); the database's pauses, handler_failing and lock waits never count"`
	ShutdownTimeout    time.Duration   `envconfig:"SHUTDOWN_TIMEOUT" desc:"the whole graceful stop after SIGTERM, every phase together: in-flight messages finish, unstarted ones are given back or stored (keep stop_grace_period at least 5s above; with tracing on, 2s of them may go to the last spans' flush)"`
	FaultsEnabled      bool            `envconfig:"FAULTS_ENABLED" default:"false" desc:"serve the fault endpoints (/faults)"`
	FaultsToken        string          `envconfig:"FAULTS_TOKEN" secret:"true" desc:"the bearer token the fault endpoints require (Authorization: Bearer <token>); required with FAULTS_ENABLED unless HTTP_ADDR listens on loopback only"`
	PprofEnabled       bool            `envconfig:"PPROF_ENABLED" default:"false" desc:"serve the Go runtime profiles on /debug/pprof/"`
	LogLevel           string          `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	// Inbox rows older than InboxRetention are pruned every InboxPruneInterval
	// (0 disables the pruner), InboxPruneBatch rows per transaction.
	InboxRetention     time.Duration `envconfig:"INBOX_RETENTION" default:"336h" desc:"inbox rows older than this are pruned; at least the redelivery horizon, max(24h, 2 × the sum of the retry delays used by MAX_ATTEMPTS attempts)"`
	InboxPruneInterval time.Duration `envconfig:"INBOX_PRUNE_INTERVAL" default:"1h" desc:"how often the service prunes the inbox; 0 disables the pruner"`
	InboxPruneBatch    int           `envconfig:"INBOX_PRUNE_BATCH" default:"1000" desc:"inbox rows deleted per transaction when pruning"`
	// IdempotencyKeyTTL is a fact about the services the handler calls, not a
	// setting of theirs: the retries must end within it, and dlq replay
	// refuses dead letters older than it (less the retries of the replay).
	IdempotencyKeyTTL time.Duration `envconfig:"IDEMPOTENCY_KEY_TTL" default:"24h" desc:"how long the services you call remember an idempotency key (Stripe: 24h); the retries must end within it and dlq replay refuses older dead letters"`
	Buffered
	Outbox
	tracing.Config // OTEL_*
	// noOutsideCalls: the service declares Options.NoOutsideCalls, and
	// IdempotencyKeyTTL is 0 (no key lifetime to respect).
	noOutsideCalls bool
	// settings are the service's own (Options.Settings), loaded with this
	// configuration: a pointer to a struct of their type.
	settings any
}

// Settings returns the service's own settings loaded with this
// configuration (a pointer to its Settings type), nil if it has none.
func (c Config) Settings() any { return c.settings }

// Outbox is the outbox relay's (a service with Options.Publishes).
type Outbox struct {
	OutboxBatch        int             `envconfig:"OUTBOX_BATCH" desc:"outbox relay: rows one claim leases and publishes together, with one confirm wait (1-1000)"`
	OutboxPollInterval time.Duration   `envconfig:"OUTBOX_POLL_INTERVAL" desc:"outbox relay: looks for unsent rows at least this often (besides this process's commits and the other replicas' NOTIFY)"`
	OutboxLease        time.Duration   `envconfig:"OUTBOX_LEASE" desc:"outbox relay: how long a claim holds its rows before another replica's relay may take them over (above the 15s publish timeout)"`
	OutboxRetryDelays  []time.Duration `envconfig:"OUTBOX_RETRY_DELAYS" desc:"outbox relay: delay before attempt n+1 after a publish the broker returned (no queue bound) or refused; the last one repeats"`
	OutboxMaxAttempts  int             `envconfig:"OUTBOX_MAX_ATTEMPTS" desc:"outbox relay: publishes of one row the broker returned or refused before it is parked (the defaults span about 78 minutes); a broker away costs none"`
}

func (o *Outbox) validate(v *Checks) {
	v.Require(o.OutboxBatch >= 1 && o.OutboxBatch <= 1000, "OUTBOX_BATCH", "must be between 1 and 1000, got %d", o.OutboxBatch)
	v.Require(o.OutboxPollInterval >= 10*time.Millisecond && o.OutboxPollInterval <= time.Minute, "OUTBOX_POLL_INTERVAL",
		"must be between 10ms and 1m, got %s", o.OutboxPollInterval)
	v.Require(o.OutboxLease > 15*time.Second && o.OutboxLease <= time.Hour, "OUTBOX_LEASE",
		"must be above the 15s publish timeout (two relays must never publish one row at once) and at most 1h, got %s", o.OutboxLease)
	v.Require(len(o.OutboxRetryDelays) > 0, "OUTBOX_RETRY_DELAYS", "needs at least one delay")
	for _, d := range o.OutboxRetryDelays {
		v.Require(d >= 10*time.Millisecond && d <= 24*time.Hour, "OUTBOX_RETRY_DELAYS", "each delay must be between 10ms and 24h, got %s", d)
	}
	v.Require(o.OutboxMaxAttempts >= 1 && o.OutboxMaxAttempts <= 10000, "OUTBOX_MAX_ATTEMPTS", "must be between 1 and 10000, got %d", o.OutboxMaxAttempts)
}

// Buffered is the choice of inbox and the buffered inbox's processing.
type Buffered struct {
	InboxMode          string          `envconfig:"INBOX_MODE" default:"inline" desc:"inline: dedupe and apply each message while its delivery waits unacked; buffered: store and ack at once, then process from the table in order per ordering key"`
	BufferRetryDelays  []time.Duration `envconfig:"BUFFER_RETRY_DELAYS" desc:"buffered mode: delay before processing run n+1 after run n failed, comma-separated; the last one repeats"`
	BufferMaxAttempts  int             `envconfig:"BUFFER_MAX_ATTEMPTS" desc:"buffered mode: processing runs of one message, the first included, before it is parked (the defaults span about 78 minutes)"`
	BufferPollInterval time.Duration   `envconfig:"BUFFER_POLL_INTERVAL" desc:"buffered mode: workers look for due messages at least this often (besides the wake-ups of ingest and NOTIFY)"`
}

// Inbox modes.
const (
	ModeInline   = "inline"
	ModeBuffered = "buffered"
)

func (b *Buffered) validate(v *Checks) {
	v.Require(b.InboxMode == ModeInline || b.InboxMode == ModeBuffered, "INBOX_MODE", "must be inline or buffered, got %q", b.InboxMode)
	v.Require(len(b.BufferRetryDelays) > 0, "BUFFER_RETRY_DELAYS", "needs at least one delay")
	for _, d := range b.BufferRetryDelays {
		v.Require(d >= 10*time.Millisecond && d <= 24*time.Hour, "BUFFER_RETRY_DELAYS", "each delay must be between 10ms and 24h, got %s", d)
	}
	v.Require(b.BufferMaxAttempts >= 1 && b.BufferMaxAttempts <= 10000, "BUFFER_MAX_ATTEMPTS", "must be between 1 and 10000, got %d", b.BufferMaxAttempts)
	v.Require(b.BufferPollInterval >= 10*time.Millisecond && b.BufferPollInterval <= time.Minute, "BUFFER_POLL_INTERVAL",
		"must be between 10ms and 1m, got %s", b.BufferPollInterval)
}

// Broker is the RabbitMQ connection and the topology the consumer declares.
type Broker struct {
	AMQPURL          string        `envconfig:"AMQP_URL" default:"amqp://guest:guest@localhost:5672/" desc:"broker URL, or a cluster's nodes separated by commas (same user and vhost; each reconnect tries them in turn); everything lives in its vhost"`
	Heartbeat        time.Duration `envconfig:"AMQP_HEARTBEAT" desc:"AMQP heartbeat; a dead link is detected within about three"`
	Exchange         string        `envconfig:"EXCHANGE" desc:"topic exchange the consumed events are published to (no kit default)"`
	RoutingKey       string        `envconfig:"ROUTING_KEY" desc:"binding key of the work queue (no kit default)"`
	Queue            string        `envconfig:"QUEUE" desc:"quorum work queue (default <service>.<event>)"`
	DeadLetterEx     string        `envconfig:"DEAD_LETTER_EXCHANGE" desc:"direct exchange for dead letters (default <service>.dlx)"`
	DeadLetterQueue  string        `envconfig:"DEAD_LETTER_QUEUE" desc:"queue where dead letters wait (default <queue>.dlq)"`
	DeliveryLimit    int           `envconfig:"QUEUE_DELIVERY_LIMIT" default:"20" desc:"broker-side delivery limit for crash loops (x-delivery-limit)"`
	QueueReplicas    int           `envconfig:"QUEUE_REPLICAS" default:"0" desc:"nodes holding a replica of each queue (x-quorum-initial-group-size); 0: the broker's default, 3 or every node of a smaller cluster; fixed when a queue is first declared"`
	ReconnectMaxWait time.Duration `envconfig:"RECONNECT_MAX_WAIT" desc:"cap of the jittered reconnect backoff"`
	// SingleActiveConsumer is a queue argument: RabbitMQ refuses to declare
	// an existing queue with another value (PRECONDITION_FAILED).
	SingleActiveConsumer bool `envconfig:"SINGLE_ACTIVE_CONSUMER" default:"false" desc:"declare the work queue with x-single-active-consumer: one replica consumes at a time, in the broker's order (the buffered inbox then stores each key's messages in the order published); fixed when the queue is first declared: RabbitMQ refuses another value (PRECONDITION_FAILED) until the queue is deleted"`
	// MoreBindings are those of the further events the service's code
	// consumes (kit.ConsumeAlso), each exchange filled in: set in code, not
	// by a variable.
	MoreBindings []rabbit.Binding `ignored:"true"`
}

// Database is the service's PostgreSQL pool.
type Database struct {
	URL              string        `envconfig:"DATABASE_URL" desc:"PostgreSQL URL of the service's database"`
	MaxConns         int           `envconfig:"DB_MAX_CONNS" default:"10" desc:"connections to the database at most: at least DB_COMMITTERS + 2 (the inbox look-ups); what is left beyond those, the outbox relay's 1 (a service that publishes) and 1 more (pruner, gauges, operators) is a read-only pool for the handler's own reads (at least 1); readiness and the pause checks have a connection of their own"`
	StatementTimeout time.Duration `envconfig:"DB_STATEMENT_TIMEOUT" default:"5s" desc:"statement_timeout and lock_timeout of each session (idle-in-transaction sessions are ended after 4×); below 7.5s (15s with GROUP_COMMIT_MAX=1), so that a commit's lock waits end before the 15s it gets"`
}

// validate reports every out-of-range value, naming its variable.
func (c *Config) validate(v *Checks) {
	c.Broker.validate(v)
	c.Database.validate(v)
	tracing.Check(c.Config, v.Require)
	v.Require(c.Consumer != "", "CONSUMER_NAME", "must not be empty")
	v.Require(validListenAddr(c.HTTPAddr), "HTTP_ADDR", "must be host:port or :port with a port of 0 to 65535, got %q", c.HTTPAddr)
	v.FaultsToken(c.FaultsEnabled, c.FaultsToken, c.HTTPAddr)
	v.Require(c.Prefetch >= 1 && c.Prefetch <= 1000, "PREFETCH", "must be between 1 and 1000, got %d", c.Prefetch)
	v.Require(c.Workers >= 1 && c.Workers <= c.Prefetch, "WORKERS", "must be between 1 and PREFETCH (%d), got %d: raise PREFETCH or lower WORKERS", c.Prefetch, c.Workers)
	v.Require(c.DBCommitters >= 1, "DB_COMMITTERS", "must be at least 1, got %d", c.DBCommitters)
	// Each committer holds a connection for its transaction, each inbox
	// look-up reader one for its read.
	v.Require(c.DBCommitters+consumer.LookupReaders <= c.MaxConns, "DB_MAX_CONNS",
		"must be at least DB_COMMITTERS + %d look-up readers = %d, got %d: raise DB_MAX_CONNS",
		consumer.LookupReaders, c.DBCommitters+consumer.LookupReaders, c.MaxConns)
	v.Require(c.GroupCommitMax >= 1 && c.GroupCommitMax <= 1000, "GROUP_COMMIT_MAX", "must be between 1 (a transaction per message) and 1000, got %d", c.GroupCommitMax)
	v.Require(c.GroupCommitWait >= 0 && c.GroupCommitWait <= time.Second, "GROUP_COMMIT_WAIT", "must be between 0 and 1s, got %s", c.GroupCommitWait)
	v.Require(c.MaxBodyBytes >= 256, "MAX_BODY_BYTES", "must be at least 256, got %d", c.MaxBodyBytes)
	v.Require(c.HandlerTimeout > 0, "HANDLER_TIMEOUT", "must be positive, got %s", c.HandlerTimeout)
	// RabbitMQ closes the channel of a consumer that holds a delivery for longer
	// than consumer_timeout (30 minutes by default); stay far below it.
	v.Require(c.HandlerTimeout <= 10*time.Minute, "HANDLER_TIMEOUT", "must be at most 10m (RabbitMQ's consumer_timeout is 30m), got %s", c.HandlerTimeout)
	ValidateRetries(v, c.RetryDelays, c.MaxAttempts)
	c.Buffered.validate(v) // before the checks derived from the buffered retries
	c.Outbox.validate(v)
	c.validateTimeouts(v)
	ValidateRetention(v, c.InboxRetention, c.InboxPruneBatch, c.RetryDelays, c.MaxAttempts)
	v.Require(c.InboxPruneInterval == 0 || c.InboxPruneInterval >= time.Second, "INBOX_PRUNE_INTERVAL",
		"must be 0 (disabled) or at least 1s, got %s", c.InboxPruneInterval)
	// One message failing alone must never pause: put back without spending
	// an attempt, it would fail, pause and call out again forever.
	v.Require(c.PauseAfterFailures == -1 || c.PauseAfterFailures >= 2, "PAUSE_AFTER_FAILURES",
		"must be -1 (never) or at least 2 (distinct messages; one message failing alone is its own trouble), got %d", c.PauseAfterFailures)
	// An unbounded hold would let one message that makes its handler pause
	// stop the consumer every cycle, forever.
	v.Require(c.MaxHolds >= 1 && c.MaxHolds <= 10000, "MAX_HOLDS", "must be between 1 and 10000, got %d", c.MaxHolds)
	v.Require(c.ShutdownTimeout > 0, "SHUTDOWN_TIMEOUT", "must be positive, got %s", c.ShutdownTimeout)
	v.Require(ValidLogLevel(c.LogLevel), "LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
}

func (b *Broker) validate(v *Checks) {
	v.AMQPURL("AMQP_URL", b.AMQPURL)
	v.Require(b.Heartbeat >= time.Second, "AMQP_HEARTBEAT", "must be at least 1s, got %s", b.Heartbeat)
	v.Require(b.Exchange != "", "EXCHANGE", "must be set: the exchange to consume from has no default")
	v.Require(b.RoutingKey != "", "ROUTING_KEY", "must be set: the binding key to consume has no default")
	v.Require(b.Queue != "", "QUEUE", "must not be empty")
	v.Require(b.DeadLetterEx != "", "DEAD_LETTER_EXCHANGE", "must not be empty")
	v.Require(b.DeadLetterQueue != "", "DEAD_LETTER_QUEUE", "must not be empty")
	v.Require(b.DeliveryLimit >= 1, "QUEUE_DELIVERY_LIMIT", "must be at least 1, got %d", b.DeliveryLimit)
	v.Require(b.QueueReplicas >= 0 && b.QueueReplicas <= 99, "QUEUE_REPLICAS", "must be 0 (the broker's default) to 99, got %d", b.QueueReplicas)
	v.Require(b.ReconnectMaxWait >= 100*time.Millisecond, "RECONNECT_MAX_WAIT", "must be at least 100ms, got %s", b.ReconnectMaxWait)
}

func (d *Database) validate(v *Checks) {
	v.URL("DATABASE_URL", d.URL, "postgres", "postgresql")
	v.Require(d.MaxConns >= 2, "DB_MAX_CONNS", "must be at least 2, got %d", d.MaxConns)
	v.Require(d.StatementTimeout >= 100*time.Millisecond, "DB_STATEMENT_TIMEOUT", "must be at least 100ms, got %s", d.StatementTimeout)
}

// validateTimeouts checks the timeouts that bound one another.
func (c *Config) validateTimeouts(v *Checks) {
	// A retry that calls out after the callee forgot the key repeats the side
	// effect: a card charged twice.
	span := c.LongestRetrySpan()
	v.Require(c.noOutsideCalls || v.Failed(append(c.RetryVariables(), "HANDLER_TIMEOUT")...) || c.IdempotencyKeyTTL > span, "IDEMPOTENCY_KEY_TTL",
		"is %s, but the retries of %s and HANDLER_TIMEOUT=%s may take %s "+
			"(every delay in full and every run up to HANDLER_TIMEOUT): a retry after the key expired would repeat "+
			"its side effect; shorten the retries or set IDEMPOTENCY_KEY_TTL to what the services you call promise",
		c.IdempotencyKeyTTL, c.RetrySettings(), c.HandlerTimeout, span)
	// A commit transaction may wait on a lock held by a duplicate on another
	// replica: a batch once for its combined claim and once more for that
	// message's own claim in its savepoint pass. lock_timeout must end those
	// waits before the commit's own deadline does, or the whole batch fails
	// instead of the one message.
	waits := time.Duration(1)
	if c.GroupCommitMax > 1 {
		waits = 2
	}
	v.Require(waits*c.StatementTimeout < consumer.CommitTimeout, "DB_STATEMENT_TIMEOUT",
		"must be below %s with GROUP_COMMIT_MAX=%d (a commit gets %s and may wait %d lock timeouts), got %s",
		consumer.CommitTimeout/waits, c.GroupCommitMax, consumer.CommitTimeout, waits, c.StatementTimeout)
}

// LongestRetrySpan is the longest time from the start of a message's first
// handler run to the end of its last: every retry delay in full and every run
// up to HANDLER_TIMEOUT. Time a message waits in the work queue behind a
// backlog or through an outage (a message put back for the database or a
// paused dependency spends no attempt) comes on top: no setting bounds it.
//
// In the buffered mode the handler's runs are the processing's, retried from
// the table with BUFFER_RETRY_DELAYS and BUFFER_MAX_ATTEMPTS (the ingest's
// retries call nothing out).
func (c Config) LongestRetrySpan() time.Duration {
	delays, attempts := c.handlerRetries()
	return retention.RetryHorizon(delays, attempts) + time.Duration(attempts)*c.HandlerTimeout
}

// handlerRetries are the retry delays and attempts of the handler's runs.
func (c Config) handlerRetries() ([]time.Duration, int) {
	if c.InboxMode == ModeBuffered {
		return c.BufferRetryDelays, c.BufferMaxAttempts
	}
	return c.RetryDelays, c.MaxAttempts
}

// RetryVariables names the variables of the handler's retries: RETRY_DELAYS
// and MAX_ATTEMPTS, or in the buffered mode BUFFER_RETRY_DELAYS and
// BUFFER_MAX_ATTEMPTS. A check derived from the retries skips itself when
// one of them failed (Checks.Failed).
func (c Config) RetryVariables() []string {
	if c.InboxMode == ModeBuffered {
		return []string{"BUFFER_RETRY_DELAYS", "BUFFER_MAX_ATTEMPTS"}
	}
	return []string{"RETRY_DELAYS", "MAX_ATTEMPTS"}
}

// RetrySettings names the variables of the handler's retries and their
// values, for messages: RETRY_DELAYS and MAX_ATTEMPTS, or in the buffered
// mode BUFFER_RETRY_DELAYS and BUFFER_MAX_ATTEMPTS.
func (c Config) RetrySettings() string {
	delays, attempts := c.handlerRetries()
	if c.InboxMode == ModeBuffered {
		return fmt.Sprintf("BUFFER_RETRY_DELAYS=%s and BUFFER_MAX_ATTEMPTS=%d", render(delays), attempts)
	}
	return fmt.Sprintf("RETRY_DELAYS=%s and MAX_ATTEMPTS=%d", render(delays), attempts)
}

// ShortestRetrySpan is the shortest time from a message's first handler run
// to its last: every retry delay cut by the full jitter, every run failing at
// once.
func (c Config) ShortestRetrySpan() time.Duration {
	horizon := retention.RetryHorizon(c.handlerRetries())
	return time.Duration(float64(horizon) * (1 - consumer.RetryJitter))
}

// NoOutsideCalls reports whether the service declared that it calls no
// service that remembers idempotency keys (Options.NoOutsideCalls).
func (c Config) NoOutsideCalls() bool { return c.noOutsideCalls }

// ReplayMaxAge is the oldest a dead letter may be for dlq replay to move it
// back without --force: the replay's own retries must end while the services
// it calls still remember its idempotency keys.
func (c Config) ReplayMaxAge() time.Duration {
	if c.noOutsideCalls {
		return math.MaxInt64 // no key to outlive
	}
	return c.IdempotencyKeyTTL - c.LongestRetrySpan()
}

// ValidateRetries checks the retry schedule.
func ValidateRetries(v *Checks, delays []time.Duration, maxAttempts int) {
	v.Require(len(delays) > 0, "RETRY_DELAYS", "needs at least one delay")
	for _, d := range delays {
		v.Require(d >= 10*time.Millisecond && d <= 24*time.Hour, "RETRY_DELAYS", "each delay must be between 10ms and 24h, got %s", d)
	}
	v.Require(maxAttempts >= 1 && maxAttempts <= 100, "MAX_ATTEMPTS", "must be between 1 and 100, got %d", maxAttempts)
}

// ValidateRetention checks the inbox window against the broker's redelivery
// horizon (see retention.MinWindow): a row pruned while its message can still
// be redelivered would let the redelivery be applied a second time.
func ValidateRetention(v *Checks, window time.Duration, batch int, delays []time.Duration, maxAttempts int) {
	floor := retention.MinWindow(delays, maxAttempts)
	v.Require(window >= floor, "INBOX_RETENTION",
		"must be at least %s, the redelivery horizon of RETRY_DELAYS=%s and MAX_ATTEMPTS=%d (%s), got %s",
		floor, render(delays), maxAttempts, retention.MinWindowRule, window)
	v.Require(batch >= 1 && batch <= retention.MaxBatchSize, "INBOX_PRUNE_BATCH",
		"must be between 1 and %d, got %d", retention.MaxBatchSize, batch)
}

// ValidLogLevel reports whether s is a level the logging package knows.
func ValidLogLevel(s string) bool {
	switch s {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// FaultsToken requires FAULTS_TOKEN of a program whose fault endpoints are
// on (FAULTS_ENABLED) and whose HTTP_ADDR listens beyond loopback: anyone
// reaching the port could crash it or change its behaviour.
func (c *Checks) FaultsToken(enabled bool, token, httpAddr string) {
	c.Require(!enabled || token != "" || loopbackOnly(httpAddr), "FAULTS_TOKEN",
		"must be set with FAULTS_ENABLED=true while HTTP_ADDR=%q listens beyond loopback: anyone reaching the port could use the fault endpoints", httpAddr)
}

// loopbackOnly reports whether a listen address takes connections from this
// host alone (127.0.0.1, ::1, localhost).
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validListenAddr reports whether addr is an address net.Listen takes for
// TCP: an optional host and a numeric port.
func validListenAddr(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}
