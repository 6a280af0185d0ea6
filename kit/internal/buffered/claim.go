package buffered

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/pgqueue"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Lease identifies a claimed message: the key it heads and the claim's token.
// Everything that settles the message checks the token in the same statement.
type Lease struct {
	ID          int64 // the row's id
	OrderingKey string
	Seq         int64
	Token       int64
}

// Claimed is a message a worker holds, with its lease.
type Claimed struct {
	Lease
	MessageID   string
	Attempts    int // runs of the retry budget begun, this one included
	Runs        int // every claim of the message, this one included: an operator's retry resets Attempts, not Runs
	Holds       int // releases a pause the handler asked for cost it (Release with counts); an operator's retry resets them
	ContentType string
	Headers     amqp.Table
	Body        []byte
	PublishedAt time.Time // zero: unknown
	ReceivedAt  time.Time
}

// inboxQueue is the buffered inbox's place in the kit's one leased, per-key
// ordered queue (pgqueue): its rules, and the statements that claim, lock
// and advance, are the outbox's too. A message is due pending, failed (its
// retry's time came) or processing (its lease ended: its holder died).
var inboxQueue = pgqueue.Table{Items: "inbox_messages", Keys: "inbox_keys", Owner: "consumer",
	Due: []string{"'pending'", "'processing'", "'failed'"}}

// claim leases up to $2 due messages, oldest due first, for $3 seconds under
// token $4 (pgqueue.Table.Claim), and marks them processing with one more
// attempt. Only a key's head is ever due, so a claim takes one message of a
// key at most and never scans a key's backlog.
var claim = inboxQueue.Claim(`, status = 'processing', attempts = o.attempts + 1, runs = o.runs + 1, claimed_at = now()`, headColumns)

// headColumns are the columns of a claimed message, in claimIn's order.
const headColumns = `o.id, o.ordering_key, o.seq, o.message_id, o.attempts, o.runs, o.holds, o.content_type, o.headers, o.body, o.published_at, o.received_at`

// Claim leases up to n due messages for lease and returns them, marked
// processing with one more attempt: a key's head at most per key. Its
// transaction is short: nothing stays open while the handler runs.
//
// The claim must read the due index in order and stop after n messages.
// Before autovacuum has analyzed the table (a fresh table taking a burst),
// the planner estimates a handful of due messages and would collect all of
// them and sort them instead: 80 ms a claim with 200,000 due keys, against
// 0.1 ms in index order. enable_sort off, for this transaction only, rules
// that out.
func (s *Store) Claim(ctx context.Context, n int, lease time.Duration) ([]Claimed, error) {
	db, err := s.db.DB()
	if err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("claim messages of %s: %w", s.consumer, err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `SET LOCAL enable_sort = off`); err != nil {
		return nil, fmt.Errorf("claim messages of %s: %w", s.consumer, err)
	}
	token := pgqueue.NewToken()
	out, err := s.claimIn(ctx, tx, token, n, lease)
	if err != nil {
		return nil, fmt.Errorf("claim messages of %s: %w", s.consumer, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claim messages of %s: commit: %w", s.consumer, err)
	}
	return out, nil
}

// claimIn runs the claim in tx and returns the messages leased under token.
func (s *Store) claimIn(ctx context.Context, tx *sql.Tx, token int64, n int, lease time.Duration) ([]Claimed, error) {
	rows, err := tx.QueryContext(ctx, claim, database.CustomPlan, s.consumer, n, lease.Seconds(), token)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		var c Claimed
		var headers []byte
		var published sql.NullTime
		if err := rows.Scan(&c.ID, &c.OrderingKey, &c.Seq, &c.MessageID, &c.Attempts, &c.Runs, &c.Holds, &c.ContentType,
			&headers, &c.Body, &published, &c.ReceivedAt); err != nil {
			return nil, err
		}
		c.Token, c.PublishedAt = token, published.Time
		if c.Headers, err = rabbit.HeadersFromJSON(headers); err != nil {
			return nil, fmt.Errorf("message %s: %w", c.MessageID, err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// NextDue is when the next message becomes due (a retry, a lease's end), or
// ok false if no key has work that is not blocked. A time in the past means
// work is due now.
func (s *Store) NextDue(ctx context.Context) (at time.Time, ok bool, err error) {
	var t sql.NullTime
	err = s.db.WithContext(ctx).Raw(`SELECT min(available_at) FROM inbox_messages
		WHERE consumer = ? AND status IN ('pending', 'processing', 'failed') AND available_at < 'infinity'`, s.consumer).Row().Scan(&t)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next due message of %s: %w", s.consumer, err)
	}
	return t.Time, t.Valid, nil
}

// Notify sends a NOTIFY on channel, so that the replicas LISTENing there look
// for due messages now.
func (s *Store) Notify(ctx context.Context, channel string) error {
	db, err := s.db.DB()
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, `SELECT pg_notify($1, '')`, channel)
	return err
}
