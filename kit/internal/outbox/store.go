package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/pgqueue"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// Store is the relay's and the operators' access to one producer's outbox.
// The relay's statements read a growing table by lists of ids and keys: they
// run unprepared (database.CustomPlan), planned for their parameters each
// time. A generic plan cached while the table was small read every pending
// row for each mark.
type Store struct {
	db       *sql.DB
	producer string
}

// NewStore returns the outbox rows of producer in db.
func NewStore(db *sql.DB, producer string) *Store { return &Store{db: db, producer: producer} }

// Producer is the name the store's rows carry.
func (s *Store) Producer() string { return s.producer }

// Claimed is a row leased for publishing.
type Claimed struct {
	ID          string
	Exchange    string
	RoutingKey  string
	ContentType string
	Headers     amqp.Table
	Body        []byte
	Mandatory   bool
	OrderingKey string // "" unordered
	Seq         int64
	Attempts    int // failed publishes so far
	CreatedAt   time.Time
	// Token is the claim's lease: every settlement of the row names it, so
	// that a row whose lease passed to another relay is left to that one.
	Token int64
	// leasedUntil is when the lease ends at the earliest, by this process's
	// clock: the claim's start plus the lease.
	leasedUntil time.Time
}

// outboxQueue is the outbox's place in the kit's one leased, per-key ordered
// queue (pgqueue): its rules, and the statements that claim, lock and
// advance, are the buffered inbox's too.
var outboxQueue = pgqueue.Table{Items: "outbox", Keys: "outbox_keys", Owner: "producer", Due: []string{"'pending'"}}

// claim leases up to $2 due rows, oldest due first, for $3 seconds under
// token $4 (pgqueue.Table.Claim). Only rows committed are seen: the claim
// reads pending rows, never "the ids after the last one sent", which would
// skip a row of a transaction that committed after a later one.
var claim = outboxQueue.Claim("", `o.id, o.exchange, o.routing_key, o.content_type, o.headers, o.body, o.mandatory,
	coalesce(o.ordering_key, ''), coalesce(o.seq, 0), o.attempts, o.created_at`)

// Claim leases up to n due rows for lease and returns them with the lease's
// token, ordered rows of one key never more than one (the key's head).
func (s *Store) Claim(ctx context.Context, n int, lease time.Duration) ([]Claimed, int64, error) {
	token := pgqueue.NewToken()
	leasedUntil := time.Now().Add(lease)
	rows, err := s.db.QueryContext(ctx, claim, database.CustomPlan, s.producer, n, lease.Seconds(), token)
	if err != nil {
		return nil, 0, fmt.Errorf("claim outbox rows of %s: %w", s.producer, err)
	}
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		var c Claimed
		var headers []byte
		if err := rows.Scan(&c.ID, &c.Exchange, &c.RoutingKey, &c.ContentType, &headers, &c.Body, &c.Mandatory,
			&c.OrderingKey, &c.Seq, &c.Attempts, &c.CreatedAt); err != nil {
			return nil, 0, err
		}
		if c.Headers, err = rabbit.HeadersFromJSON(headers); err != nil {
			return nil, 0, fmt.Errorf("outbox row %s: %w", c.ID, err)
		}
		c.Token, c.leasedUntil = token, leasedUntil
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("claim outbox rows of %s: %w", s.producer, err)
	}
	// Oldest first, and a key's rows in their order (one at most per claim).
	slices.SortStableFunc(out, func(a, b Claimed) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, token, nil
}

// leases are the ids of rows and the tokens of their claims, as the arrays of
// a statement. A row is settled only while it is leased to one of the
// tokens: the tokens are random, one per claim, so a row whose lease passed
// to another relay is not. (Pairs of id and token would say more, but an
// unnest join is planned far worse than = ANY.)
func leases(rows []Claimed) (ids []string, tokens []int64) {
	ids = make([]string, len(rows))
	for i, c := range rows {
		ids[i] = c.ID
		if !slices.Contains(tokens, c.Token) {
			tokens = append(tokens, c.Token)
		}
	}
	return ids, tokens
}

// markUnordered marks rows sent in one statement, one round trip: no key to
// move on.
const markUnordered = `UPDATE outbox SET status = 'sent', sent_at = now(), lease_token = NULL, last_error = NULL
	WHERE id = ANY($1::uuid[]) AND lease_token = ANY($2::bigint[]) AND status = 'pending'`

// markOrdered marks rows sent and locks the keys of the ordered ones, in
// byte order (pgqueue.Table.Locked, as Enqueue locks them), returning each
// ordered row's key and number. Only rows still leased to the tokens are
// marked.
//
// #nosec G202 -- the fragment is pgqueue's, built from the package's own table names; every value is a parameter
var markOrdered = `WITH sent AS (
	UPDATE outbox SET status = 'sent', sent_at = now(), lease_token = NULL, last_error = NULL
	WHERE id = ANY($1::uuid[]) AND lease_token = ANY($2::bigint[]) AND status = 'pending'
	RETURNING ordering_key, seq
), ` + outboxQueue.Locked("sent", "$3") + `
SELECT ordering_key, seq, 0 FROM locked
UNION ALL SELECT NULL, NULL, count(*) FROM sent`

// advanceKeys moves each key past its sent head and makes the key's next row
// due, in one statement (pgqueue.Table.Advance). It runs after markOrdered,
// in a statement of its own: the keys are locked by then, so every
// transaction that enqueued to them has committed and its rows are in this
// statement's snapshot.
var advanceKeys = outboxQueue.Advance()

// MarkSent settles confirmed rows, of any claims of this producer: each is
// sent, and each ordered one moves its key on and makes the key's next row
// due. Unordered rows take one statement; ordered ones a transaction of two
// (the keys locked in byte order, as one Enqueue call locks them; a
// transaction that enqueues in several calls may lock them in another order,
// and the two can deadlock: the relay marks again, Relay.markSent). A row
// whose lease passed to another relay meanwhile is left to it. It returns
// the rows marked and the successors made due.
func (s *Store) MarkSent(ctx context.Context, sent []Claimed) (marked, due int, err error) {
	if len(sent) == 0 {
		return 0, 0, nil
	}
	ids, tokens := leases(sent)
	if !slices.ContainsFunc(sent, func(c Claimed) bool { return c.OrderingKey != "" }) {
		res, err := s.db.ExecContext(ctx, markUnordered, database.CustomPlan, ids, tokens)
		if err != nil {
			return 0, 0, fmt.Errorf("mark %d outbox rows sent: %w", len(sent), err)
		}
		n, err := res.RowsAffected()
		return int(n), 0, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("mark %d outbox rows sent: %w", len(sent), err)
	}
	defer func() { _ = tx.Rollback() }()
	keys, seqs, marked, err := s.markOrdered(ctx, tx, ids, tokens)
	if err != nil {
		return 0, 0, err
	}
	if due, err = s.advance(ctx, tx, keys, seqs); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("mark %d outbox rows sent: commit: %w", len(sent), err)
	}
	return marked, due, nil
}

func (s *Store) markOrdered(ctx context.Context, tx *sql.Tx, ids []string, tokens []int64) (keys []string, seqs []int64, marked int, err error) {
	rows, err := tx.QueryContext(ctx, markOrdered, database.CustomPlan, ids, tokens, s.producer)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("mark %d outbox rows sent: %w", len(ids), err)
	}
	if keys, seqs, marked, err = pgqueue.ScanLocked(rows); err != nil {
		return nil, nil, 0, fmt.Errorf("mark %d outbox rows sent: %w", len(ids), err)
	}
	return keys, seqs, marked, nil
}

// advance moves the keys of the ordered rows just marked on, and makes
// their next rows due; it returns how many it made due.
func (s *Store) advance(ctx context.Context, tx *sql.Tx, keys []string, seqs []int64) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	res, err := tx.ExecContext(ctx, advanceKeys, database.CustomPlan, s.producer, keys, seqs)
	if err != nil {
		return 0, fmt.Errorf("move %d outbox keys on: %w", len(keys), err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// Fail records a failed publish of a claimed row: due again after delay, or
// parked with reason once it failed maxAttempts times. It reports whether
// the row was parked.
func (s *Store) Fail(ctx context.Context, c Claimed, delay time.Duration, maxAttempts int, reason, lastErr string) (bool, error) {
	var parked bool
	err := s.db.QueryRowContext(ctx, `UPDATE outbox SET attempts = attempts + 1, last_error = $4, lease_token = NULL,
			status = CASE WHEN attempts + 1 >= $5 THEN 'parked' ELSE status END,
			park_reason = CASE WHEN attempts + 1 >= $5 THEN $6 ELSE park_reason END,
			parked_at = CASE WHEN attempts + 1 >= $5 THEN now() ELSE parked_at END,
			available_at = now() + make_interval(secs => $3)
		WHERE id = $1 AND lease_token = $2 AND status = 'pending'
		RETURNING status = 'parked'`, c.ID, c.Token, delay.Seconds(), wire.ErrorText(lastErr), maxAttempts, reason).Scan(&parked)
	if err == sql.ErrNoRows {
		return false, nil // the lease passed to another relay
	}
	if err != nil {
		return false, fmt.Errorf("record the failed publish of outbox row %s: %w", c.ID, err)
	}
	return parked, nil
}

// Release gives claimed rows back without counting an attempt (the broker
// went away, not their fault): due again after delay.
func (s *Store) Release(ctx context.Context, rows []Claimed, delay time.Duration) error {
	if len(rows) == 0 {
		return nil
	}
	ids, tokens := leases(rows)
	_, err := s.db.ExecContext(ctx, `UPDATE outbox SET available_at = now() + make_interval(secs => $3), lease_token = NULL
		WHERE id = ANY($1::uuid[]) AND lease_token = ANY($2::bigint[]) AND status = 'pending'`, database.CustomPlan, ids, tokens, delay.Seconds())
	if err != nil {
		return fmt.Errorf("release %d outbox rows: %w", len(rows), err)
	}
	return nil
}

// Status is the outbox of a producer at a glance.
type Status struct {
	Pending       int
	Parked        int
	OldestPending time.Time // zero when nothing is pending
}

// Status counts the unsent rows.
func (s *Store) Status(ctx context.Context) (Status, error) {
	var st Status
	var oldest sql.NullTime
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'parked'),
			min(created_at) FILTER (WHERE status = 'pending')
		FROM outbox WHERE producer = $1 AND status <> 'sent'`, s.producer).Scan(&st.Pending, &st.Parked, &oldest)
	if err != nil {
		return st, fmt.Errorf("outbox status of %s: %w", s.producer, err)
	}
	st.OldestPending = oldest.Time
	return st, nil
}

// Parked is a parked row, for an operator.
type Parked struct {
	ID          string    `json:"id"`
	Exchange    string    `json:"exchange"`
	RoutingKey  string    `json:"routing_key"`
	OrderingKey string    `json:"ordering_key,omitempty"`
	Attempts    int       `json:"attempts"`
	Reason      string    `json:"reason"`
	LastError   string    `json:"last_error"`
	CreatedAt   time.Time `json:"created_at"`
	ParkedAt    time.Time `json:"parked_at"`
}

// ListParked returns up to limit parked rows, longest parked first.
func (s *Store) ListParked(ctx context.Context, limit int) ([]Parked, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, exchange, routing_key, coalesce(ordering_key, ''), attempts,
			coalesce(park_reason, ''), coalesce(last_error, ''), created_at, parked_at
		FROM outbox WHERE producer = $1 AND status = 'parked' ORDER BY parked_at LIMIT $2`, s.producer, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked outbox rows of %s: %w", s.producer, err)
	}
	defer rows.Close()
	var out []Parked
	for rows.Next() {
		var p Parked
		if err := rows.Scan(&p.ID, &p.Exchange, &p.RoutingKey, &p.OrderingKey, &p.Attempts, &p.Reason, &p.LastError,
			&p.CreatedAt, &p.ParkedAt); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Retry makes parked rows pending and due now with a fresh budget: the one
// with id, or all when id is "". It returns how many.
func (s *Store) Retry(ctx context.Context, id string) (int, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE outbox SET status = 'pending', attempts = 0, available_at = now(),
			park_reason = NULL, parked_at = NULL
		WHERE producer = $1 AND status = 'parked' AND ($2 = '' OR id::text = $2)`, s.producer, id)
	if err != nil {
		return 0, fmt.Errorf("retry parked outbox rows of %s: %w", s.producer, err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// Skipped is a parked row an operator gave up on, as it was.
type Skipped struct {
	Parked
	ContentType string         `json:"content_type"`
	Headers     map[string]any `json:"headers"`
	Body        []byte         `json:"body"`
	Seq         int64          `json:"seq,omitempty"`
}

// Skip gives up the parked row with id: it is deleted, and if it held its
// ordering key (the key's head), the key goes on to its next row, in the
// same transaction, its lock taken first as the mark takes it. It returns
// the row as it was, for the operator to keep; ErrNotParked if no parked
// row of the producer has that id. A row that can never be published (an
// invalid one) or whose event is no longer wanted has no other way out:
// retry parks it again.
func (s *Store) Skip(ctx context.Context, id string) (Skipped, error) {
	var k Skipped
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return k, fmt.Errorf("skip outbox row %s: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	var headers []byte
	var key sql.NullString
	err = tx.QueryRowContext(ctx, `SELECT id, exchange, routing_key, ordering_key, coalesce(seq, 0), attempts, coalesce(park_reason, ''),
			coalesce(last_error, ''), created_at, parked_at, content_type, headers, body
		FROM outbox WHERE producer = $1 AND id::text = $2 AND status = 'parked' FOR UPDATE`, s.producer, id).Scan(
		&k.ID, &k.Exchange, &k.RoutingKey, &key, &k.Seq, &k.Attempts, &k.Reason, &k.LastError, &k.CreatedAt, &k.ParkedAt,
		&k.ContentType, &headers, &k.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return k, fmt.Errorf("skip outbox row %s: %w", id, ErrNotParked)
	}
	if err != nil {
		return k, fmt.Errorf("skip outbox row %s: %w", id, err)
	}
	k.OrderingKey = key.String
	if k.Headers, err = rabbit.HeadersFromJSON(headers); err != nil {
		return k, err
	}
	if key.Valid {
		if _, err := tx.ExecContext(ctx, `SELECT 1 FROM outbox_keys WHERE producer = $1 AND ordering_key = $2 FOR UPDATE`, s.producer, key.String); err != nil {
			return k, fmt.Errorf("skip outbox row %s: lock its key: %w", id, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM outbox WHERE id = $1`, k.ID); err != nil {
		return k, fmt.Errorf("skip outbox row %s: %w", id, err)
	}
	if key.Valid {
		if _, err := s.advance(ctx, tx, []string{key.String}, []int64{k.Seq}); err != nil {
			return k, err
		}
	}
	if err := tx.Commit(); err != nil {
		return k, fmt.Errorf("skip outbox row %s: commit: %w", id, err)
	}
	return k, nil
}

// ErrNotParked: no parked row has the id.
var ErrNotParked = errors.New("no parked row with that id")

// PruneSent deletes up to limit rows sent longer than window ago and
// reports how many; unsent rows are never pruned.
func (s *Store) PruneSent(ctx context.Context, window time.Duration, limit int) (int, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM outbox WHERE id IN (
			SELECT id FROM outbox WHERE producer = $1 AND status = 'sent' AND sent_at < now() - make_interval(secs => $2)
			ORDER BY sent_at LIMIT $3)`, s.producer, window.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("prune sent outbox rows of %s: %w", s.producer, err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}
