// Package retention prunes the inbox: rows older than a window are deleted in
// small batches, each its own short transaction, by one replica at a time. The
// window may never be shorter than the time the broker can still redeliver a
// message, because a redelivery that finds no inbox row is applied again.
package retention

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults of the service's configuration.
const (
	DefaultWindow    = 14 * 24 * time.Hour
	DefaultBatchSize = 1000
	// DefaultPause between batches lets autovacuum, replicas and the inbox's
	// own transactions keep up with a large prune.
	DefaultPause = 10 * time.Millisecond
	// MaxBatchSize keeps one batch well inside a statement timeout of seconds.
	MaxBatchSize = 100_000
)

// horizonFloor is the least time a message may wait in a queue unconsumed: a
// service that is down for a day (a weekend outage, a stuck deploy) is
// consumed again afterwards, and its first deliveries can be redeliveries of
// messages it had already applied.
const horizonFloor = 24 * time.Hour

// MinWindowRule states MinWindow for error messages and docs.
const MinWindowRule = "max(24h, 2 × the sum of the retry delays used by MAX_ATTEMPTS attempts)"

// ErrWindowTooShort means the retention window ends before the broker stops
// redelivering: a late redelivery would find no inbox row and be applied again.
var ErrWindowTooShort = errors.New("retention window shorter than the redelivery horizon")

// MinWindow is the shortest safe retention window: the longest a message can
// spend travelling through the retry queues, doubled, but never under a day.
//
// A message makes maxAttempts-1 trips through the delay queues; trip n waits
// retryDelays[n-1], the last delay repeating (the runtime's rule). Doubling
// covers the time spent between trips in the work queue behind a backlog and
// in handler runs up to their timeout; the one-day floor covers a message that
// sits unconsumed while the service is down, which no delay sum bounds.
func MinWindow(retryDelays []time.Duration, maxAttempts int) time.Duration {
	return max(horizonFloor, 2*RetryHorizon(retryDelays, maxAttempts))
}

// RetryHorizon is the time a message spends in the delay queues over
// maxAttempts attempts: maxAttempts-1 trips, trip n waiting retryDelays[n-1],
// the last delay repeating (the runtime's rule). The runtime's jitter only
// shortens a trip.
func RetryHorizon(retryDelays []time.Duration, maxAttempts int) time.Duration {
	var trips time.Duration
	for n := 1; n < maxAttempts && len(retryDelays) > 0; n++ {
		trips += retryDelays[min(n-1, len(retryDelays)-1)]
	}
	return trips
}

// Config tunes a Pruner.
type Config struct {
	Consumer string        // prune this consumer's rows only
	Window   time.Duration // rows received longer ago than this are deleted
	// BatchSize rows are deleted per transaction; a batch that deletes fewer
	// ends the run.
	BatchSize int
	// Pause between batches; 0 runs them back to back.
	Pause time.Duration
	// Interval between scheduled runs (Run); 0 disables the schedule.
	Interval time.Duration
	// RetryDelays and MaxAttempts are the consumer runtime's, and bound Window
	// from below (MinWindow).
	RetryDelays []time.Duration
	MaxAttempts int
	// Buffered also prunes the buffered inbox's tables (the migrations'
	// Buffered set must be applied): its finished messages (processed,
	// skipped, dead_lettered) that finished longer ago than Window, and the
	// ordering keys left with no message. Pending, processing, failed and
	// parked messages are never pruned.
	Buffered bool
	// Outbox also prunes the outbox (the migrations' Outbox set must be
	// applied): rows of producer Consumer sent longer ago than Window, and
	// the ordering keys left with none. Unsent rows are never pruned.
	Outbox bool
}

// Validate reports a configuration that would prune too early or not at all.
func (c Config) Validate() error {
	switch {
	case c.Consumer == "":
		return errors.New("consumer name is empty")
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return fmt.Errorf("batch size %d is not between 1 and %d", c.BatchSize, MaxBatchSize)
	case c.Interval < 0 || c.Pause < 0:
		return errors.New("interval and pause must not be negative")
	}
	if floor := MinWindow(c.RetryDelays, c.MaxAttempts); c.Window < floor {
		return fmt.Errorf("window %s is below %s (%s): %w", c.Window, floor, MinWindowRule, ErrWindowTooShort)
	}
	return nil
}

// Pruner deletes one consumer's old inbox rows.
type Pruner struct {
	db      *sql.DB
	cfg     Config
	lockKey int64
	metrics *Metrics
	log     *slog.Logger
}

// New returns a pruner over the payments database db.
func New(db *sql.DB, cfg Config, m *Metrics, log *slog.Logger) (*Pruner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("inbox retention: %w", err)
	}
	return &Pruner{
		db:      db,
		cfg:     cfg,
		lockKey: lockKey(cfg.Consumer),
		metrics: m,
		log:     log.With("component", "inbox-retention", "consumer", cfg.Consumer),
	}, nil
}
