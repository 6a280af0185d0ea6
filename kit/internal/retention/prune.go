package retention

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inbox-template/payment-service/kit/internal/wait"
)

// Result is what one prune run did.
type Result struct {
	Skipped bool      // another run held the lock: nothing was done
	Cutoff  time.Time // rows received before this were deleted (database clock)
	Deleted int64
	Batches int
	// The buffered inbox's rows deleted (Config.Buffered): finished messages
	// and ordering keys left without any.
	DeletedMessages, DeletedKeys int64
	// The outbox's rows deleted (Config.Outbox): sent messages and ordering
	// keys left without any.
	DeletedSent, DeletedOutboxKeys int64
	LongestBatch                   time.Duration
	Elapsed                        time.Duration
}

// deleteBatch deletes the oldest rows of one batch. Rows are picked by ctid
// through ARRAY(…) so that PostgreSQL deletes them with a TID scan; FOR UPDATE
// SKIP LOCKED passes over a row another transaction holds instead of waiting
// for it. As a single statement, each batch is its own short transaction:
// locks live for one batch, never for the whole run.
const deleteBatch = `
DELETE FROM inbox WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM inbox
	WHERE consumer = $1 AND received_at < $2 %s
	ORDER BY received_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED))`

// keepUnfinished is the condition, in the buffered mode, that keeps the
// inbox row of a message stored but not finished (pending, failed or parked
// for longer than the window: a dependency down for weeks, a head waiting
// for an operator): it is that message's dedupe, and without it a
// redelivery of the same id would be stored again and applied twice.
const keepUnfinished = `
	AND NOT EXISTS (SELECT 1 FROM inbox_messages m
		WHERE m.consumer = inbox.consumer AND m.message_id = inbox.message_id
			AND m.status NOT IN ('processed', 'skipped', 'dead_lettered'))`

// prunable is the condition on the inbox's old rows that may go.
func (p *Pruner) prunable() string {
	if p.cfg.Buffered {
		return keepUnfinished
	}
	return ""
}

// Prune deletes the consumer's rows older than the window, batch by batch,
// until a batch deletes fewer than the batch size. It runs only if it can take
// the consumer's advisory lock at once; otherwise it returns Skipped, because
// another replica is pruning the same rows right now.
func (p *Pruner) Prune(ctx context.Context) (Result, error) {
	start := time.Now()
	// A session advisory lock belongs to a connection, so the run keeps one
	// connection of the pool from lock to unlock.
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("prune inbox of %s: take a connection: %w", p.cfg.Consumer, err)
	}
	defer conn.Close()
	var locked bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, p.lockKey).Scan(&locked); err != nil {
		return Result{}, fmt.Errorf("prune inbox of %s: take the lock: %w", p.cfg.Consumer, err)
	}
	if !locked {
		return Result{Skipped: true}, nil
	}
	defer p.unlock(conn)
	res, err := p.deleteOld(ctx, conn)
	if err == nil && p.cfg.Buffered {
		err = p.deleteFinished(ctx, conn, &res)
	}
	if err == nil && p.cfg.Outbox {
		err = p.deleteSent(ctx, conn, &res)
	}
	res.Elapsed = time.Since(start)
	return res, err
}

func (p *Pruner) deleteOld(ctx context.Context, conn *sql.Conn) (Result, error) {
	var res Result
	var err error
	// One cutoff for the whole run, on the database's clock (received_at is
	// its now()): rows that age past the window meanwhile wait for the next run,
	// so a run always ends.
	if res.Cutoff, err = p.cutoff(ctx, conn); err != nil {
		return res, err
	}
	for {
		began := time.Now()
		r, err := conn.ExecContext(ctx, fmt.Sprintf(deleteBatch, p.prunable()), p.cfg.Consumer, res.Cutoff, p.cfg.BatchSize)
		if err != nil {
			return res, fmt.Errorf("prune inbox of %s: batch %d: %w", p.cfg.Consumer, res.Batches+1, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return res, fmt.Errorf("prune inbox of %s: rows deleted: %w", p.cfg.Consumer, err)
		}
		res.Batches++
		res.Deleted += n
		res.LongestBatch = max(res.LongestBatch, time.Since(began))
		p.metrics.pruned.WithLabelValues(p.cfg.Consumer).Add(float64(n))
		if n < int64(p.cfg.BatchSize) {
			return res, nil
		}
		if !sleep(ctx, p.cfg.Pause) {
			return res, fmt.Errorf("prune inbox of %s: %w", p.cfg.Consumer, ctx.Err())
		}
	}
}

// deleteFinishedBatch deletes the oldest finished messages of the buffered
// inbox, as deleteBatch does the inbox's, and returns their ordering keys.
const deleteFinishedBatch = `
DELETE FROM inbox_messages WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM inbox_messages
	WHERE consumer = $1 AND status IN ('processed', 'skipped', 'dead_lettered') AND finished_at < $2
	ORDER BY finished_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED))
RETURNING ordering_key`

// deleteIdleKeys deletes the keys of a batch left with no message (so none
// leased either). A key's sequence starts again at 1 if it comes back, which is safe
// only because no message of it remains. An ingest appending to a key locks
// its row first, so the delete either waits and finds the key busy, or goes
// first and the ingest creates the key anew. The keys are locked first in
// byte order, as every statement of the queue locks them (pgqueue), so that
// the delete and an ingest of several keys cannot deadlock.
const deleteIdleKeys = `
WITH locked AS (
	SELECT ordering_key FROM inbox_keys WHERE consumer = $1 AND ordering_key = ANY($2)
	ORDER BY ordering_key COLLATE "C" FOR UPDATE
)
DELETE FROM inbox_keys k USING locked l
WHERE k.consumer = $1 AND k.ordering_key = l.ordering_key AND k.next_seq > k.last_seq
	AND NOT EXISTS (SELECT 1 FROM inbox_messages m WHERE m.consumer = k.consumer AND m.ordering_key = k.ordering_key)`

// keyedTable is a table of rows with ordering keys that retention prunes in
// batches: the buffered inbox's messages, the outbox's rows. Each batch
// deletes the oldest finished rows (returning their keys), then the keys left
// with none.
type keyedTable struct {
	what       string // for errors: "buffered messages", "sent outbox rows"
	deleteRows string // $1 consumer, $2 cutoff, $3 batch size; RETURNING the key
	deleteKeys string // $1 consumer, $2 the batch's keys
	rows, keys *int64
	pruned     func() prometheus.Counter
}

// deleteKeyed prunes t with the run's cutoff.
func (p *Pruner) deleteKeyed(ctx context.Context, conn *sql.Conn, res *Result, t keyedTable) error {
	for batch := 1; ; batch++ {
		began := time.Now()
		keys, err := p.deleteReturningKeys(ctx, conn, t.deleteRows, res.Cutoff)
		if err != nil {
			return fmt.Errorf("prune %s of %s: batch %d: %w", t.what, p.cfg.Consumer, batch, err)
		}
		r, err := conn.ExecContext(ctx, t.deleteKeys, p.cfg.Consumer, keys)
		if err != nil {
			return fmt.Errorf("prune the ordering keys of the %s of %s: %w", t.what, p.cfg.Consumer, err)
		}
		gone, _ := r.RowsAffected()
		*t.rows += int64(len(keys))
		*t.keys += gone
		res.LongestBatch = max(res.LongestBatch, time.Since(began))
		t.pruned().Add(float64(len(keys)))
		if len(keys) < p.cfg.BatchSize {
			return nil
		}
		if !sleep(ctx, p.cfg.Pause) {
			return fmt.Errorf("prune %s of %s: %w", t.what, p.cfg.Consumer, ctx.Err())
		}
	}
}

// deleteFinished prunes the buffered inbox.
func (p *Pruner) deleteFinished(ctx context.Context, conn *sql.Conn, res *Result) error {
	return p.deleteKeyed(ctx, conn, res, keyedTable{what: "buffered messages", deleteRows: deleteFinishedBatch, deleteKeys: deleteIdleKeys,
		rows: &res.DeletedMessages, keys: &res.DeletedKeys,
		pruned: func() prometheus.Counter { return p.metrics.prunedBuffered.WithLabelValues(p.cfg.Consumer) }})
}

func (p *Pruner) deleteReturningKeys(ctx context.Context, conn *sql.Conn, query string, cutoff time.Time) ([]string, error) {
	rows, err := conn.QueryContext(ctx, query, p.cfg.Consumer, cutoff, p.cfg.BatchSize)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// Pending is what a run would delete now: inbox rows, and in the buffered
// mode finished messages, all from before Cutoff.
type Pending struct {
	Cutoff   time.Time
	Rows     int64 // inbox rows
	Messages int64 // finished messages of the buffered inbox
}

// Pending counts what a run would delete now, without deleting anything.
func (p *Pruner) Pending(ctx context.Context) (Pending, error) {
	var res Pending
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return res, fmt.Errorf("count prunable inbox rows: %w", err)
	}
	defer conn.Close()
	if res.Cutoff, err = p.cutoff(ctx, conn); err != nil {
		return res, err
	}
	err = conn.QueryRowContext(ctx, `SELECT count(*) FROM inbox WHERE consumer = $1 AND received_at < $2`+p.prunable(),
		p.cfg.Consumer, res.Cutoff).Scan(&res.Rows)
	if err != nil {
		return res, fmt.Errorf("count prunable inbox rows of %s: %w", p.cfg.Consumer, err)
	}
	if !p.cfg.Buffered {
		return res, nil
	}
	err = conn.QueryRowContext(ctx, `SELECT count(*) FROM inbox_messages
		WHERE consumer = $1 AND status IN ('processed', 'skipped', 'dead_lettered') AND finished_at < $2`,
		p.cfg.Consumer, res.Cutoff).Scan(&res.Messages)
	if err != nil {
		return res, fmt.Errorf("count prunable buffered messages of %s: %w", p.cfg.Consumer, err)
	}
	return res, nil
}

func (p *Pruner) cutoff(ctx context.Context, conn *sql.Conn) (time.Time, error) {
	var t time.Time
	err := conn.QueryRowContext(ctx, `SELECT now() - make_interval(secs => $1)`, p.cfg.Window.Seconds()).Scan(&t)
	if err != nil {
		return t, fmt.Errorf("prune inbox of %s: compute cutoff: %w", p.cfg.Consumer, err)
	}
	return t, nil
}

// unlock releases the advisory lock. A session lock outlives its statement, so
// a connection whose unlock failed must not go back to the pool holding it:
// it is discarded instead, and closing the session releases the lock.
func (p *Pruner) unlock(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var released bool
	err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, p.lockKey).Scan(&released)
	if err == nil && released {
		return
	}
	p.log.Warn("could not release the prune lock; discarding its connection", "err", err)
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// lockKey is the advisory lock of one consumer's prune runs: replicas of the
// same consumer exclude each other, different consumers sharing the table do not.
func lockKey(consumer string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("inbox-retention:" + consumer))
	return int64(h.Sum64()) // #nosec G115 -- the hash's bits as an advisory lock key; wrapping is intended
}

// sleep waits for d or until ctx is done, and reports whether it slept fully.
func sleep(ctx context.Context, d time.Duration) bool { return wait.Sleep(ctx, d) }

// deleteSentBatch deletes the oldest sent rows of the outbox, as deleteBatch
// does the inbox's, and returns their ordering keys ("" for unordered rows).
// Unsent rows (pending, parked) are never pruned.
const deleteSentBatch = `
DELETE FROM outbox WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM outbox
	WHERE producer = $1 AND status = 'sent' AND sent_at < $2
	ORDER BY sent_at
	LIMIT $3
	FOR UPDATE SKIP LOCKED))
RETURNING coalesce(ordering_key, '')`

// deleteIdleOutboxKeys deletes the keys of a batch left with no row, all of
// them sent. A key's sequence starts again at 1 if it comes back, which is
// safe only because no row of it remains; Enqueue locks the key's row first,
// so the delete either waits and finds the key busy, or goes first and
// Enqueue creates the key anew. The keys are locked first in byte order
// (see deleteIdleKeys).
const deleteIdleOutboxKeys = `
WITH locked AS (
	SELECT ordering_key FROM outbox_keys WHERE producer = $1 AND ordering_key = ANY($2)
	ORDER BY ordering_key COLLATE "C" FOR UPDATE
)
DELETE FROM outbox_keys k USING locked l
WHERE k.producer = $1 AND k.ordering_key = l.ordering_key AND k.next_seq > k.last_seq
	AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.producer = k.producer AND o.ordering_key = k.ordering_key)`

// deleteSent prunes the outbox's sent rows.
func (p *Pruner) deleteSent(ctx context.Context, conn *sql.Conn, res *Result) error {
	return p.deleteKeyed(ctx, conn, res, keyedTable{what: "sent outbox rows", deleteRows: deleteSentBatch, deleteKeys: deleteIdleOutboxKeys,
		rows: &res.DeletedSent, keys: &res.DeletedOutboxKeys,
		pruned: func() prometheus.Counter { return p.metrics.prunedOutbox.WithLabelValues(p.cfg.Consumer) }})
}
