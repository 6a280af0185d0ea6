package buffered

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Stats is what an operator sees of a consumer's buffer.
type Stats struct {
	// Counts per status. The finished ones (processed, skipped,
	// dead_lettered) are counted only when asked for: they are most of the
	// table until retention prunes them.
	Counts map[Status]int64
	// OldestUnfinished is when the oldest message still to process (pending,
	// processing or failed) was received; zero if there is none.
	OldestUnfinished time.Time
	// BlockedKeys is how many keys have a parked head, and BlockedMessages how
	// many messages wait behind those heads.
	BlockedKeys, BlockedMessages int64
	// Now is the database's clock when the stats were read.
	Now time.Time
}

// Stats reads the counts of the consumer's messages by status, the oldest
// message still to process and the blocked keys; finished adds the counts of
// finished messages (a scan of them, for inboxctl rather than for metrics).
func (s *Store) Stats(ctx context.Context, finished bool) (Stats, error) {
	db, err := s.db.DB()
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Counts: map[Status]int64{}}
	// The statuses are literals, so that the planner matches the partial
	// index of unfinished messages: the gauges read this every 10 s, and the
	// finished rows are most of the table.
	queries := []string{`SELECT status, count(*), min(received_at) FILTER (WHERE status <> 'parked') FROM inbox_messages
		WHERE consumer = $1 AND status IN ('pending', 'processing', 'failed', 'parked') GROUP BY status`}
	if finished {
		queries = append(queries, `SELECT status, count(*), NULL::timestamptz FROM inbox_messages
		WHERE consumer = $1 AND status IN ('processed', 'skipped', 'dead_lettered') GROUP BY status`)
	}
	for _, q := range queries {
		if err := s.countStatuses(ctx, db, q, &st); err != nil {
			return st, err
		}
	}
	err = db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(k.last_seq - k.next_seq), 0), now()
		FROM inbox_messages m JOIN inbox_keys k ON k.consumer = m.consumer AND k.ordering_key = m.ordering_key AND k.next_seq = m.seq
		WHERE m.consumer = $1 AND m.status = 'parked'`, s.consumer).Scan(&st.BlockedKeys, &st.BlockedMessages, &st.Now)
	if err != nil {
		return st, fmt.Errorf("count blocked keys of %s: %w", s.consumer, err)
	}
	return st, nil
}

func (s *Store) countStatuses(ctx context.Context, db *sql.DB, query string, st *Stats) error {
	rows, err := db.QueryContext(ctx, query, s.consumer)
	if err != nil {
		return fmt.Errorf("count messages of %s by status: %w", s.consumer, err)
	}
	defer rows.Close()
	for rows.Next() {
		var status Status
		var n int64
		var oldest sql.NullTime
		if err := rows.Scan(&status, &n, &oldest); err != nil {
			return err
		}
		st.Counts[status] = n
		if oldest.Valid && !isFinished(status) && (st.OldestUnfinished.IsZero() || oldest.Time.Before(st.OldestUnfinished)) {
			st.OldestUnfinished = oldest.Time
		}
	}
	return rows.Err()
}

func isFinished(s Status) bool {
	return s == StatusProcessed || s == StatusSkipped || s == StatusDeadLettered
}

// Parked is a parked message, the head of a blocked key.
type Parked struct {
	Lease
	MessageID   string
	Attempts    int
	Reason      string
	LastError   string
	ReceivedAt  time.Time
	ParkedAt    time.Time
	Waiting     int64 // messages of the key behind it
	ContentType string
	Headers     amqp.Table
	Body        []byte
	PublishedAt time.Time // zero: unknown
}

// Selector chooses parked messages: by message id, by ordering key, or all.
type Selector struct {
	MessageID   string
	OrderingKey string
	All         bool
}

// Validate requires exactly one choice.
func (sel Selector) Validate() error {
	n := 0
	for _, set := range []bool{sel.MessageID != "", sel.OrderingKey != "", sel.All} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("choose exactly one of a message id, an ordering key, or all")
	}
	return nil
}

// parkedHeads selects the parked heads (the keys they block) matching $2
// (message id), $3 (key) or all ($2 and $3 empty).
const parkedHeads = `
SELECT m.id, m.ordering_key, m.seq, m.message_id, m.attempts, coalesce(m.park_reason, ''), coalesce(m.last_error, ''),
	m.received_at, m.parked_at, k.last_seq - k.next_seq, m.content_type, m.headers, m.body, m.published_at
FROM inbox_messages m JOIN inbox_keys k
	ON k.consumer = m.consumer AND k.ordering_key = m.ordering_key AND k.next_seq = m.seq
WHERE m.consumer = $1 AND m.status = 'parked'
	AND ($2 = '' OR m.message_id = $2) AND ($3 = '' OR m.ordering_key = $3)
ORDER BY m.parked_at
LIMIT $4`

// ListParked returns up to limit parked messages chosen by sel, longest
// parked first.
func (s *Store) ListParked(ctx context.Context, sel Selector, limit int) ([]Parked, error) {
	db, err := s.db.DB()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, parkedHeads, s.consumer, sel.MessageID, sel.OrderingKey, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked messages of %s: %w", s.consumer, err)
	}
	defer rows.Close()
	var out []Parked
	for rows.Next() {
		var p Parked
		var headers []byte
		var published sql.NullTime
		if err := rows.Scan(&p.ID, &p.OrderingKey, &p.Seq, &p.MessageID, &p.Attempts, &p.Reason, &p.LastError,
			&p.ReceivedAt, &p.ParkedAt, &p.Waiting, &p.ContentType, &headers, &p.Body, &published); err != nil {
			return nil, err
		}
		p.PublishedAt = published.Time
		if p.Headers, err = rabbit.HeadersFromJSON(headers); err != nil {
			return nil, fmt.Errorf("message %s: %w", p.MessageID, err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// unpark settles parked heads chosen by sel (see parkedHeads): msgSet is
// the SET list of the message; advance moves its key on to the next
// message, which becomes due (pgqueue.Table.Advance, in a statement of its
// own after this one locked the keys in byte order). The message must still
// be its key's parked head. extra adds CTEs to the statement.
func (s *Store) unpark(ctx context.Context, sel Selector, msgSet string, advance bool, extra ...string) (int, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	db, err := s.db.DB()
	if err != nil {
		return 0, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	// #nosec G202 -- msgSet and extra are the package's own SQL fragments; every value is a parameter
	q := `WITH target AS (
		SELECT k.ordering_key, m.id, m.seq, m.message_id FROM inbox_keys k JOIN inbox_messages m
			ON m.consumer = k.consumer AND m.ordering_key = k.ordering_key AND m.seq = k.next_seq
		WHERE k.consumer = $1 AND m.status = 'parked'
			AND ($2 = '' OR m.message_id = $2) AND ($3 = '' OR k.ordering_key = $3)
		ORDER BY k.ordering_key COLLATE "C"
		FOR UPDATE OF k, m
	)` + strings.Join(extra, "") + `
	UPDATE inbox_messages m SET ` + msgSet + ` FROM target t WHERE m.id = t.id
	RETURNING t.ordering_key, t.seq`
	keys, seqs, err := keySeqs(tx.QueryContext(ctx, q, s.consumer, sel.MessageID, sel.OrderingKey))
	if err != nil {
		return 0, err
	}
	if advance && len(keys) > 0 {
		if _, err := tx.ExecContext(ctx, inboxQueue.Advance(), s.consumer, keys, seqs); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return len(keys), nil
}

// keySeqs reads rows of a key and a sequence number.
func keySeqs(rows *sql.Rows, err error) (keys []string, seqs []int64, _ error) {
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var seq int64
		if err := rows.Scan(&k, &seq); err != nil {
			return nil, nil, err
		}
		keys, seqs = append(keys, k), append(seqs, seq)
	}
	return keys, seqs, rows.Err()
}

// Retry gives the chosen parked messages a fresh retry budget (attempts and
// holds): each is pending again and due now. It returns how many it re-armed.
func (s *Store) Retry(ctx context.Context, sel Selector) (int, error) {
	n, err := s.unpark(ctx, sel,
		`status = 'pending', attempts = 0, holds = 0, available_at = now(), park_reason = NULL`, false)
	if err != nil {
		return n, fmt.Errorf("retry parked messages of %s: %w", s.consumer, err)
	}
	return n, nil
}

// Skip gives up the chosen parked messages: each is skipped (kept for its
// record until retention) and its key moves on to the next message.
func (s *Store) Skip(ctx context.Context, sel Selector) (int, error) {
	n, err := s.unpark(ctx, sel, `status = 'skipped', finished_at = now()`, true)
	if err != nil {
		return n, fmt.Errorf("skip parked messages of %s: %w", s.consumer, err)
	}
	return n, nil
}

// MarkDeadLettered records that a parked message was published to the
// dead-letter queue: it is dead_lettered, its key moves on, and its inbox row
// is deleted in the same statement, so that a replay from the dead-letter
// queue is stored again as a new message (at the end of its key) instead of
// being taken for a duplicate. ok false means it was no longer parked
// (retried or skipped meanwhile): then the copy in the dead-letter queue is
// one too many, and a replay of it is a duplicate the inbox suppresses.
func (s *Store) MarkDeadLettered(ctx context.Context, p Parked) (ok bool, err error) {
	n, err := s.unpark(ctx, Selector{MessageID: p.MessageID}, `status = 'dead_lettered', finished_at = now()`, true,
		`, forget AS (DELETE FROM inbox i USING target t WHERE i.consumer = $1 AND i.message_id = t.message_id)`)
	if err != nil {
		return false, fmt.Errorf("mark message %s dead-lettered: %w", p.MessageID, err)
	}
	return n == 1, nil
}
