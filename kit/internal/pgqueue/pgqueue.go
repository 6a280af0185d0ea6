// Package pgqueue is the kit's one leased, per-key ordered queue in
// PostgreSQL: the buffered inbox's stored messages (inbox_messages,
// inbox_keys) and the outbox's rows (outbox, outbox_keys) are two tables of
// it. The package holds its rules and the statements that carry them out;
// each user adds its own columns and statuses.
//
// The rules:
//   - An item has a place in its ordering key: the key's row holds the
//     number of its newest item (last_seq) and of its head, the next to
//     settle (next_seq). An item is appended under its key's row lock, held
//     to the commit (Append), so the numbers of one key follow the commit
//     order and have no gaps. An item without an ordering key waits for
//     nothing: the outbox leaves its key NULL and makes it due at once, the
//     buffered inbox gives it a key of its own.
//   - Only a key's head is ever due: the items behind it wait at
//     available_at = 'infinity', beyond the range a claim scans. An item is
//     due when its status is one of the queue's due statuses and its
//     available_at has passed.
//   - A claim (Claim) leases due items, oldest due first, by moving their
//     available_at to the lease's end and writing a random token
//     (NewToken). FOR UPDATE SKIP LOCKED passes over items another claim
//     holds; a lease that ends (its holder died) makes the item due again,
//     with no sweeper. Every settlement names the token, in the same
//     statement: an item whose lease passed to another holder is left to it.
//   - Settling a head (sent, processed, skipped, dead-lettered) moves its
//     key on and makes the next item due (Advance), in a statement that runs
//     after the keys were locked (Locked, in the statement that marks the
//     heads, or the operator's statement that settles them): every
//     transaction that appended to them has committed by then, and its items
//     are in the statement's snapshot. Read in the statement that waited for
//     the lock, a successor committed meanwhile would be missed, and wait at
//     infinity forever.
//   - Keys are locked in byte order (COLLATE "C": the column's collation may
//     sort otherwise) by Append and by Locked alike, so that two transactions
//     sharing keys lock them in one order. One exception is the caller's: a
//     transaction that appends in several statements (several Enqueue calls)
//     locks its keys in the order of its calls, and can deadlock against a
//     settlement; PostgreSQL aborts one side, and the outbox's mark retries.
//   - A parked head blocks its key: its status is not a due one, and its
//     successors stay waiting until an operator retries, skips or exports
//     it.
package pgqueue

import (
	"database/sql"
	"math/rand/v2"
	"strings"
)

// Table is one queue: its two tables, the column naming whose rows they are
// (several services share a database), and the statuses in which an item
// may be due.
type Table struct {
	Items string   // the items: id, Owner, ordering_key, seq, status, available_at, lease_token, …
	Keys  string   // a row per ordering key: Owner, ordering_key, last_seq, next_seq
	Owner string   // producer, consumer
	Due   []string // statuses, as SQL literals: 'pending'
}

func (t Table) due() string { return strings.Join(t.Due, ", ") }

// NewToken is a claim's lease token.
func NewToken() int64 { return rand.Int64() }

// Claim is the statement that leases up to $2 due items of owner $1, oldest
// due first, for $3 seconds under token $4, and returns returning (columns of
// the items as o). set adds to the SET list (", status = 'processing'"): the
// user's own bookkeeping of a claim.
func (t Table) Claim(set, returning string) string {
	return `
WITH due AS (
	SELECT id FROM ` + t.Items + `
	WHERE ` + t.Owner + ` = $1 AND status IN (` + t.due() + `) AND available_at <= now()
	ORDER BY available_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE ` + t.Items + ` o SET available_at = now() + make_interval(secs => $3), lease_token = $4` + set + `
FROM due WHERE o.id = due.id
RETURNING ` + returning
}

// Append is the statement fragment that raises the last_seq of keys: an
// INSERT of rows (Owner, ordering_key, count) from source (a VALUES list or
// a SELECT, keys in byte order), returning each key's ordering_key,
// last_seq and next_seq. The n new items of a key are numbered last_seq-n+1
// to last_seq; the one numbered next_seq is the head, due now (IsHead); the
// others wait at infinity.
func (t Table) Append(source string) string {
	return `INSERT INTO ` + t.Keys + ` AS k (` + t.Owner + `, ordering_key, last_seq) ` + source + `
	ON CONFLICT (` + t.Owner + `, ordering_key) DO UPDATE SET last_seq = k.last_seq + EXCLUDED.last_seq
	RETURNING ordering_key, last_seq, next_seq`
}

// IsHead reports whether the item numbered seq of a key whose head is next
// is due at once.
func IsHead(seq, next int64) bool { return seq == next }

// Locked is the CTE that locks the keys of the items of CTE marked (columns
// ordering_key, seq), in byte order, for the owner in parameter owner ("$3");
// it yields their ordering_key and seq. The statement that marks heads
// settled ends with it, and Advance follows in a statement of its own.
func (t Table) Locked(marked, owner string) string {
	return `locked AS (
	SELECT k.ordering_key, s.seq FROM ` + t.Keys + ` k JOIN ` + marked + ` s ON k.` + t.Owner + ` = ` + owner + ` AND k.ordering_key = s.ordering_key
	ORDER BY k.ordering_key COLLATE "C"
	FOR UPDATE OF k
)`
}

// ScanLocked reads and closes the rows of a statement that ends with Locked
// and then one row of NULLs with the count marked (SELECT ordering_key,
// seq, 0 FROM locked UNION ALL SELECT NULL, NULL, count(*) FROM …): the
// arrays Advance takes, and the count.
func ScanLocked(rows *sql.Rows) (keys []string, seqs []int64, marked int, err error) {
	defer rows.Close()
	for rows.Next() {
		var key sql.NullString
		var seq sql.NullInt64
		var n int
		if err := rows.Scan(&key, &seq, &n); err != nil {
			return nil, nil, 0, err
		}
		if key.Valid {
			keys, seqs = append(keys, key.String), append(seqs, seq.Int64)
		} else {
			marked = n
		}
	}
	return keys, seqs, marked, rows.Err()
}

// Advance is the statement that moves each key $2[i] of owner $1 whose head
// is $3[i] on to the next item, and makes that item due (if its status is a
// due one). It runs after the keys were locked (Locked). The successors are
// found from the keys moved, by the unique index (owner, ordering_key, seq)
// on all three columns, with no status in the WHERE: a status there steered
// the plan, on a table not yet analyzed, to the index of unsettled items, a
// scan of the key's whole backlog (110 ms a settlement with 200,000
// waiting); found from the arrays, the plan could look the key up on two
// columns and read its history up to the head (65 ms with the head at
// 100,000 of 200,000 rows not yet pruned, never vacuumed).
func (t Table) Advance() string {
	return `WITH moved AS (
	UPDATE ` + t.Keys + ` k SET next_seq = v.seq + 1
	FROM unnest($2::text[], $3::bigint[]) AS v(key, seq)
	WHERE k.` + t.Owner + ` = $1 AND k.ordering_key = v.key AND k.next_seq = v.seq
	RETURNING k.ordering_key, k.next_seq
)
UPDATE ` + t.Items + ` o SET available_at = CASE WHEN o.status IN (` + t.due() + `) THEN now() ELSE o.available_at END
FROM moved m
WHERE o.` + t.Owner + ` = $1 AND o.ordering_key = m.ordering_key AND o.seq = m.next_seq`
}
