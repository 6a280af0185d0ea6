package buffered

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/pgqueue"
	"github.com/inbox-template/payment-service/kit/wire"
)

// Completion is a claimed message whose handler succeeded: Apply runs its
// writes in the transaction that marks it processed and moves its key to the
// next message. Apply may run more than once (see Complete): only its last run
// commits.
type Completion struct {
	Lease Lease
	Apply func(tx *gorm.DB) (outcome string, err error)
}

// Completed is what became of one Completion. Lost means the lease had passed
// to another worker (it expired): nothing of the message was committed, and
// the other worker settles it. Err means the writes failed: nothing of the
// message was committed, and it stays processing under its lease.
type Completed struct {
	Outcome string
	Lost    bool
	Err     error
}

// finish marks processed the heads of the input still leased to the caller,
// and locks their keys in byte order (pgqueue.Table.Locked), returning each
// key and number, then the count marked. A stale completion (its lease
// ended, another worker took the message over) marks nothing. advance
// follows in a statement of its own (see pgqueue).
var finish = `
WITH input AS (
	SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[]) AS i(id, token, outcome)
), settled AS (
	UPDATE inbox_messages m
	SET status = 'processed', outcome = i.outcome, finished_at = now(), lease_token = NULL
	FROM input i
	WHERE m.id = i.id AND m.lease_token = i.token AND m.status = 'processing'
	RETURNING m.ordering_key, m.seq
), ` + inboxQueue.Locked("settled", "$1") + `
SELECT ordering_key, seq, 0 FROM locked
UNION ALL SELECT NULL, NULL, count(*) FROM settled`

// advance moves the keys of the settled heads on and makes their next
// messages due (pgqueue.Table.Advance).
var advance = inboxQueue.Advance()

// errFallBack rolls back the optimistic transaction of a batch with a failure.
var errFallBack = errors.New("an item failed: run the batch with savepoints")

// Complete commits the items in one transaction (group commit), keys in
// sorted order so that concurrent batches lock them in one order. beforeCommit,
// if set, runs before COMMIT. A non-nil error means the transaction failed as
// a whole: nothing of any item was committed.
//
// The batch first runs optimistically: every item's writes, then one statement
// settling them all. If anything fails (a write, a lost lease, the COMMIT),
// that transaction rolls back and the batch runs again with a savepoint per
// item, so that the failure stays with its item; if that transaction fails as
// a whole too, each item runs in a transaction of its own.
func (s *Store) Complete(ctx context.Context, items []Completion, beforeCommit func()) ([]Completed, error) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(items[a].Lease.OrderingKey, items[b].Lease.OrderingKey) })
	if len(items) == 1 {
		return s.completeEach(ctx, items, order, beforeCommit)
	}
	if results, err := s.completeAll(ctx, items, order, beforeCommit); err == nil {
		return results, nil
	}
	results, err := s.completeEach(ctx, items, order, beforeCommit)
	if err == nil || ctx.Err() != nil {
		return results, err
	}
	// The transaction failed as a whole, at COMMIT say (a deferred constraint
	// one item broke): a transaction per item finds the one at fault, and the
	// others commit.
	for _, i := range order {
		one, err := s.completeEach(ctx, items[i:i+1], []int{0}, beforeCommit)
		if err != nil {
			results[i] = Completed{Err: err}
			continue
		}
		results[i] = one[0]
	}
	return results, nil
}

func (s *Store) completeAll(ctx context.Context, items []Completion, order []int, beforeCommit func()) ([]Completed, error) {
	results := make([]Completed, len(items))
	err := s.db.WithContext(ctx).Transaction(func(gtx *gorm.DB) error {
		for _, i := range order {
			out, err := items[i].Apply(gtx)
			if err != nil {
				return errFallBack
			}
			results[i].Outcome = out
		}
		tx, err := txOf(gtx)
		if err != nil {
			return err
		}
		n, err := s.settleProcessed(tx, items, order, results)
		if err != nil {
			return err
		}
		if n < len(items) {
			return errFallBack // a lease was lost: its writes must roll back alone
		}
		if beforeCommit != nil {
			beforeCommit()
		}
		return nil
	})
	return results, err
}

func (s *Store) settleProcessed(tx *queryTx, items []Completion, idx []int, results []Completed) (int, error) {
	var ids, tokens []int64
	var outcomes []string
	for _, i := range idx {
		l := items[i].Lease
		ids, tokens = append(ids, l.ID), append(tokens, l.Token)
		outcomes = append(outcomes, results[i].Outcome)
	}
	rows, err := tx.query(finish, s.consumer, ids, tokens, outcomes)
	if err != nil {
		return 0, fmt.Errorf("mark %d messages processed: %w", len(ids), err)
	}
	keys, seqs, marked, err := pgqueue.ScanLocked(rows)
	if err != nil {
		return 0, fmt.Errorf("mark %d messages processed: %w", len(ids), err)
	}
	if len(keys) > 0 {
		if _, err := tx.exec(advance, s.consumer, keys, seqs); err != nil {
			return 0, fmt.Errorf("move %d keys on: %w", len(keys), err)
		}
	}
	return marked, nil
}

// completeEach runs the batch with a savepoint per item (none for a single
// item): a failure or a lost lease rolls back its item alone.
func (s *Store) completeEach(ctx context.Context, items []Completion, order []int, beforeCommit func()) ([]Completed, error) {
	results := make([]Completed, len(items))
	savepoints := len(items) > 1
	committed := 0
	err := s.db.WithContext(ctx).Transaction(func(gtx *gorm.DB) error {
		tx, err := txOf(gtx)
		if err != nil {
			return err
		}
		for _, i := range order {
			ok, err := s.completeItem(gtx, tx, items, i, results, savepoints)
			if err != nil {
				return err
			}
			if ok {
				committed++
			}
		}
		if committed == 0 {
			return errNothing // nothing to commit: roll back a single item's failed writes
		}
		if beforeCommit != nil {
			beforeCommit()
		}
		return nil
	})
	if errors.Is(err, errNothing) {
		err = nil
	}
	return results, err
}

// errNothing rolls back a transaction in which no item succeeded.
var errNothing = errors.New("no item to commit")

// completeItem applies and settles item i, recording its own failure in
// its result; ok reports that it will commit. The error breaks the transaction.
func (s *Store) completeItem(gtx *gorm.DB, tx *queryTx, items []Completion, i int, results []Completed, savepoint bool) (ok bool, err error) {
	res := &results[i]
	if savepoint {
		if _, err := tx.exec("SAVEPOINT buffered_item"); err != nil {
			return false, fmt.Errorf("savepoint: %w", err)
		}
	}
	out, err := items[i].Apply(gtx)
	res.Outcome = out
	if err == nil {
		var n int
		n, err = s.settleProcessed(tx, items, []int{i}, results)
		if err == nil && n == 0 {
			res.Lost = true
		}
	} else {
		res.Err = err
	}
	if err != nil && res.Err == nil {
		res.Err = err // the settling statement failed: the message's turn, not the batch's
	}
	if res.Err == nil && !res.Lost {
		if savepoint {
			if _, err := tx.exec("RELEASE SAVEPOINT buffered_item"); err != nil {
				return false, fmt.Errorf("release savepoint: %w", err)
			}
		}
		return true, nil
	}
	if !savepoint {
		return false, nil // the transaction rolls back
	}
	// A failed statement aborts the transaction (25P02) until this rollback.
	if _, err := tx.exec("ROLLBACK TO SAVEPOINT buffered_item"); err != nil {
		return false, fmt.Errorf("roll back message %d: %w", items[i].Lease.ID, err)
	}
	return false, nil
}

// settleLease updates a leased message, if the lease is still the caller's;
// its key is left as it is. set is a SET list; $1 is the message id, $2 the
// token; further arguments follow.
func (s *Store) settleLease(ctx context.Context, l Lease, set string, args ...any) (bool, error) {
	db, err := s.db.DB()
	if err != nil {
		return false, err
	}
	// #nosec G202 -- set is the package's own SQL fragment; every value is a parameter
	q := `UPDATE inbox_messages SET ` + set + `, lease_token = NULL WHERE id = $1 AND lease_token = $2 AND status = 'processing'`
	res, err := db.ExecContext(ctx, q, append([]any{l.ID, l.Token}, args...)...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// Fail records a failed run: the message is failed, and due again after
// delay. ok false means the lease was lost and nothing was written.
func (s *Store) Fail(ctx context.Context, l Lease, delay time.Duration, cause string) (ok bool, err error) {
	ok, err = s.settleLease(ctx, l,
		`status = 'failed', last_error = $4, available_at = now() + make_interval(secs => $3)`,
		delay.Seconds(), wire.ErrorText(cause))
	if err != nil {
		return false, fmt.Errorf("record failure of message %d: %w", l.ID, err)
	}
	return ok, nil
}

// Park parks the message: its key is blocked (the messages behind it stay
// waiting) until an operator retries, skips or exports it. ok false means
// the lease was lost.
func (s *Store) Park(ctx context.Context, l Lease, reason, cause string) (ok bool, err error) {
	ok, err = s.settleLease(ctx, l,
		`status = 'parked', park_reason = $3, last_error = $4, parked_at = now()`,
		reason, wire.ErrorText(cause))
	if err != nil {
		return false, fmt.Errorf("park message %d: %w", l.ID, err)
	}
	return ok, nil
}

// Release gives a claimed message back without spending its attempt (the
// failure was not the message's: the database or a dependency of every
// message is down): it is pending or failed again, due after delay. counts
// adds one to its holds (Claimed.Holds): the release of a pause the handler
// asked for, which the caller bounds.
func (s *Store) Release(ctx context.Context, l Lease, delay time.Duration, cause string, counts bool) (ok bool, err error) {
	hold := 0
	if counts {
		hold = 1
	}
	ok, err = s.settleLease(ctx, l,
		`attempts = attempts - 1, status = CASE WHEN attempts > 1 THEN 'failed' ELSE 'pending' END,
		 last_error = $4, available_at = now() + make_interval(secs => $3), holds = holds + $5`,
		delay.Seconds(), wire.ErrorText(cause), hold)
	if err != nil {
		return false, fmt.Errorf("release message %d: %w", l.ID, err)
	}
	return ok, nil
}
