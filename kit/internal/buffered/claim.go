package buffered

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/database"
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

// claim leases up to $2 due keys, oldest due first, and marks their heads
// processing. A due key has a message to process, no parked head, and an
// available_at in the past: new work, a retry whose time has come, or a lease
// that expired because its holder died. FOR UPDATE SKIP LOCKED passes over
// keys another transaction holds (a concurrent claim, an ingest appending to
// the key, a commit settling its head), so claims never wait for each other.
// The lease moves available_at to its end: the key leaves the due set until
// it is settled or the lease expires. The head is found by its sequence
// number on the unique index, so a key's backlog is never scanned.
//
// Every leased key comes back, with its head or, where the head's columns
// are NULL, without: an ingest that committed after the statement's snapshot
// but before the key was locked leaves the key's row newer than the snapshot
// (FOR UPDATE reads the newest version) and its new head invisible to it.
// claimHeads takes those heads with a fresh snapshot.
const claim = `
WITH due AS (
	SELECT ordering_key FROM inbox_keys
	WHERE consumer = $1 AND NOT blocked AND next_seq <= last_seq AND available_at <= now()
	ORDER BY available_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), leased AS (
	UPDATE inbox_keys k
	SET available_at = now() + make_interval(secs => $3), lease_token = $4, updated_at = now()
	FROM due
	WHERE k.consumer = $1 AND k.ordering_key = due.ordering_key
	RETURNING k.ordering_key, k.next_seq
), heads AS (
	UPDATE inbox_messages m
	SET status = 'processing', attempts = m.attempts + 1, runs = m.runs + 1, claimed_at = now()
	FROM leased
	WHERE m.consumer = $1 AND m.ordering_key = leased.ordering_key AND m.seq = leased.next_seq
	RETURNING ` + headColumns + `
)
SELECT leased.ordering_key, h.* FROM leased LEFT JOIN heads h ON h.ordering_key = leased.ordering_key`

// headColumns are the columns of a claimed message, in scanHead's order.
const headColumns = `m.id, m.ordering_key, m.seq, m.message_id, m.attempts, m.runs, m.holds, m.content_type, m.headers, m.body, m.published_at, m.received_at`

// claimHeads marks processing the heads of keys this claim ($3) leased
// whose head its first statement could not see.
const claimHeads = `
UPDATE inbox_messages m
SET status = 'processing', attempts = m.attempts + 1, runs = m.runs + 1, claimed_at = now()
FROM inbox_keys k
WHERE k.consumer = $1 AND k.ordering_key = ANY($2) AND k.lease_token = $3
	AND m.consumer = k.consumer AND m.ordering_key = k.ordering_key AND m.seq = k.next_seq
RETURNING k.ordering_key, ` + headColumns

// Claim leases up to n due keys for lease and returns their head messages,
// marked processing with one more attempt. Its transaction is short: nothing
// stays open while the handler runs.
//
// The claim must read the due index in order and stop after n keys. Before
// autovacuum has analyzed the tables (a fresh table taking a burst), the
// planner estimates a handful of due keys and would collect all of them and
// sort them instead: 80 ms a claim with 200,000 due keys, against 0.1 ms in
// index order. enable_sort off, for this transaction only, rules that out.
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
	token := newToken()
	out, headless, err := s.claimIn(ctx, tx, claim, s.consumer, n, lease.Seconds(), token)
	if err == nil && len(headless) > 0 {
		out, err = s.completeClaim(ctx, tx, out, headless, token)
	}
	if err != nil {
		return nil, fmt.Errorf("claim messages of %s: %w", s.consumer, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claim messages of %s: commit: %w", s.consumer, err)
	}
	return out, nil
}

// completeClaim takes the heads of keys leased without one, the statement
// seeing what committed before it began. A key that still has none has a gap
// (a row deleted by hand): it stays leased until the lease ends, as a key
// whose holder died does, rather than being due again at once and claimed in
// a loop.
func (s *Store) completeClaim(ctx context.Context, tx *sql.Tx, out []Claimed, headless []string, token int64) ([]Claimed, error) {
	more, _, err := s.claimIn(ctx, tx, claimHeads, s.consumer, headless, token)
	if err != nil {
		return nil, err
	}
	return append(out, more...), nil
}

// claimIn runs a claiming query whose rows are a leased key and its head's
// headColumns, and returns the heads and the keys that came without one.
func (s *Store) claimIn(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]Claimed, []string, error) {
	token := args[len(args)-1].(int64)
	rows, err := tx.QueryContext(ctx, query, append([]any{database.CustomPlan}, args...)...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var out []Claimed
	var headless []string
	for rows.Next() {
		var key string
		var id, seq sql.NullInt64
		var messageID, orderingKey, contentType sql.NullString
		var attempts, runs, holds sql.NullInt32
		var headers, body []byte
		var published, received sql.NullTime
		if err := rows.Scan(&key, &id, &orderingKey, &seq, &messageID, &attempts, &runs, &holds, &contentType,
			&headers, &body, &published, &received); err != nil {
			return nil, nil, err
		}
		if !id.Valid {
			headless = append(headless, key)
			continue
		}
		c := Claimed{
			Lease:     Lease{ID: id.Int64, OrderingKey: orderingKey.String, Seq: seq.Int64, Token: token},
			MessageID: messageID.String, Attempts: int(attempts.Int32), Runs: int(runs.Int32), Holds: int(holds.Int32),
			ContentType: contentType.String, Body: body, PublishedAt: published.Time, ReceivedAt: received.Time,
		}
		if c.Headers, err = rabbit.HeadersFromJSON(headers); err != nil {
			return nil, nil, fmt.Errorf("message %s: %w", c.MessageID, err)
		}
		out = append(out, c)
	}
	return out, headless, rows.Err()
}

// NextDue is when the next key becomes due (a retry, a lease's end), or ok
// false if no key has work that is not blocked. A time in the past means
// work is due now.
func (s *Store) NextDue(ctx context.Context) (at time.Time, ok bool, err error) {
	var t sql.NullTime
	err = s.db.WithContext(ctx).Raw(`SELECT min(available_at) FROM inbox_keys
		WHERE consumer = ? AND NOT blocked AND next_seq <= last_seq`, s.consumer).Row().Scan(&t)
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
