// Package inbox is the transactional inbox: it records each message id a consumer
// has applied in the same PostgreSQL transaction as the message's effects, so a
// redelivered message is recognised and its effects are never applied twice.
package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
)

// ErrPayloadMismatch means a message id was already applied with a different
// body: the producer reused an id, and dropping the message silently would hide it.
var ErrPayloadMismatch = errors.New("message id already applied with a different payload")

// Entry is one row of the inbox table: a message id applied by a consumer.
type Entry struct {
	MessageID     string    `gorm:"column:message_id;primaryKey"`
	Consumer      string    `gorm:"column:consumer;primaryKey"`
	PayloadSHA256 []byte    `gorm:"column:payload_sha256;not null"`
	ReceivedAt    time.Time `gorm:"column:received_at;not null;default:now()"`
}

// TableName is the table of the versioned migrations.
func (Entry) TableName() string { return "inbox" }

// Inbox dedupes the messages of one consumer.
type Inbox struct {
	db       *gorm.DB
	consumer string
}

// New returns the inbox of consumer; several consumers can share one table.
func New(db *gorm.DB, consumer string) *Inbox {
	registerSavepointFlush(db)
	return &Inbox{db: db, consumer: consumer}
}

// Fingerprint is the SHA-256 of a message body.
func Fingerprint(body []byte) []byte {
	sum := sha256.Sum256(body)
	return sum[:]
}

// Key is a message to look up: its id and its body.
type Key struct {
	MessageID string
	Body      []byte
}

// Seen is what a look-up found of one Key: Applied means the id is in the
// inbox with the same body; Err is ErrPayloadMismatch if it is there with
// another body.
type Seen struct {
	Applied bool
	Err     error
}

// Seen reports whether messageID was already applied, with a plain read that
// takes no lock: a known duplicate can then skip the handler and its outside
// calls. It returns ErrPayloadMismatch if the id was applied with another body.
// A false answer is only a hint: the claim in Commit decides.
func (ib *Inbox) Seen(ctx context.Context, messageID string, body []byte) (bool, error) {
	seen, err := ib.SeenMany(ctx, []Key{{MessageID: messageID, Body: body}})
	if err != nil {
		return false, err
	}
	return seen[0].Applied, seen[0].Err
}

// SeenMany is Seen for many messages with one read.
func (ib *Inbox) SeenMany(ctx context.Context, keys []Key) ([]Seen, error) {
	sqlDB, err := ib.db.DB()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.MessageID
	}
	found, err := fingerprints(ctx, sqlDB, ib.consumer, ids)
	if err != nil {
		return nil, fmt.Errorf("look up %d messages in inbox: %w", len(keys), err)
	}
	out := make([]Seen, len(keys))
	for i, k := range keys {
		sum, ok := found[k.MessageID]
		switch {
		case !ok:
		case !bytes.Equal(sum, Fingerprint(k.Body)):
			out[i].Err = fmt.Errorf("message %s: %w", k.MessageID, ErrPayloadMismatch)
		default:
			out[i].Applied = true
		}
	}
	return out, nil
}

// querier is a *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// fingerprints reads the stored fingerprints of the ids present in the inbox.
func fingerprints(ctx context.Context, q querier, consumer string, ids []string) (map[string][]byte, error) {
	rows, err := q.QueryContext(ctx,
		`SELECT message_id, payload_sha256 FROM inbox WHERE consumer = $1 AND message_id = ANY($2)`, database.CustomPlan, consumer, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := make(map[string][]byte, len(ids))
	for rows.Next() {
		var id string
		var sum []byte
		if err := rows.Scan(&id, &sum); err != nil {
			return nil, err
		}
		found[id] = sum
	}
	return found, rows.Err()
}

// Item is one message to commit: its id and body, and the writes that must
// commit together with its inbox row. Apply runs only if the id is claimed now
// (not applied before); nil Apply commits the inbox row alone. Apply may run
// more than once (see Commit): only its last run commits.
type Item struct {
	MessageID string
	Body      []byte
	Apply     func(tx *gorm.DB) error
}

// Result is what became of one Item. Fresh means its id was claimed and its
// writes applied; false with a nil Err means it had been applied before (a
// duplicate). A non-nil Err means the item was rolled back alone.
type Result struct {
	Fresh bool
	Err   error
}

// Commit claims and applies every item in one transaction (group commit): one
// COMMIT, and so one WAL flush, for all of them. An item whose claim or writes
// fail is rolled back alone and reported in its Result while the others
// commit. A non-nil error means the transaction as a whole failed (begin or
// COMMIT): then nothing of any item was committed, whatever the Results say.
//
// A batch first runs optimistically: one INSERT claims every id, then each
// item's writes run, with no savepoint, then what they deferred (Defer). If anything fails, that transaction
// is rolled back and the batch runs again with a savepoint per item, so that
// the failure stays with its item; if that transaction fails as a whole (at
// COMMIT: a deferred constraint), each item runs in a transaction of its own.
// So an item's Apply may run up to three times; only its last run commits. Items are claimed in message-id order, so
// two batches holding some of the same ids (duplicates on two replicas) take
// the row locks in one order.
func (ib *Inbox) Commit(ctx context.Context, items []Item) ([]Result, error) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(items[a].MessageID, items[b].MessageID) })
	if len(items) == 1 {
		return ib.commitEach(ctx, items, order)
	}
	if results, err := ib.commitFast(ctx, items, order); err == nil {
		return results, nil
	}
	results, err := ib.commitEach(ctx, items, order)
	if err == nil || ctx.Err() != nil {
		return results, err
	}
	// The transaction failed as a whole, at COMMIT say (a deferred constraint
	// one item broke): one transaction per item finds the one at fault, and
	// the others commit.
	for _, i := range order {
		one, err := ib.commitEach(ctx, items[i:i+1], []int{0})
		results[i] = one[0]
		if err != nil {
			results[i] = Result{Err: err}
		}
	}
	return results, nil
}

// errFallBack rolls back the optimistic transaction of a batch with a failure.
var errFallBack = errors.New("an item failed: run the batch with savepoints")

// commitFast claims the whole batch with one statement and applies each fresh
// item; any failure rolls it all back (errFallBack, or the transaction's).
func (ib *Inbox) commitFast(ctx context.Context, items []Item, order []int) ([]Result, error) {
	results := make([]Result, len(items))
	err := ib.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		b := &batch{}
		b.begin(tx)
		defer b.end()
		claimed, err := ib.claimAll(tx, items, order)
		if err != nil {
			return err
		}
		known, err := ib.knownFingerprints(tx, items, claimed)
		if err != nil {
			return err
		}
		first := map[string]int{} // id → the item that claimed it in this batch
		for _, i := range order {
			it := items[i]
			if claimed[it.MessageID] {
				if j, dup := first[it.MessageID]; dup {
					known[it.MessageID] = Fingerprint(items[j].Body)
				} else {
					first[it.MessageID] = i
					results[i].Fresh = true
					if it.Apply != nil && it.Apply(tx) != nil {
						return errFallBack
					}
					continue
				}
			}
			if !bytes.Equal(known[it.MessageID], Fingerprint(it.Body)) {
				return errFallBack // a payload mismatch: let the careful pass report it
			}
		}
		if b.stop(tx) != nil {
			return errFallBack // the savepoint pass writes at once and finds the item
		}
		return nil
	})
	return results, err
}

// claimAll inserts every distinct id of the batch, ON CONFLICT DO NOTHING, and
// returns the ids it inserted: the others were applied before.
func (ib *Inbox) claimAll(tx *gorm.DB, items []Item, order []int) (map[string]bool, error) {
	var values strings.Builder
	args := make([]any, 0, 3*len(items))
	seen := map[string]bool{}
	for _, i := range order {
		it := items[i]
		if seen[it.MessageID] {
			continue
		}
		seen[it.MessageID] = true
		if len(args) > 0 {
			values.WriteString(", ")
		}
		values.WriteString("(?, ?, ?)")
		args = append(args, it.MessageID, ib.consumer, Fingerprint(it.Body))
	}
	rows, err := tx.Raw(`INSERT INTO inbox (message_id, consumer, payload_sha256) VALUES `+values.String()+
		` ON CONFLICT DO NOTHING RETURNING message_id`, args...).Rows()
	if err != nil {
		return nil, fmt.Errorf("claim %d messages in inbox: %w", len(seen), err)
	}
	defer rows.Close()
	claimed := make(map[string]bool, len(seen))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		claimed[id] = true
	}
	return claimed, rows.Err()
}

// knownFingerprints reads the stored fingerprints of the ids not claimed now.
func (ib *Inbox) knownFingerprints(tx *gorm.DB, items []Item, claimed map[string]bool) (map[string][]byte, error) {
	var ids []string
	for _, it := range items {
		if !claimed[it.MessageID] && !slices.Contains(ids, it.MessageID) {
			ids = append(ids, it.MessageID)
		}
	}
	if len(ids) == 0 {
		return map[string][]byte{}, nil
	}
	sqlTx, ok := tx.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return nil, errors.New("inbox: not in a database/sql transaction")
	}
	return fingerprints(tx.Statement.Context, sqlTx, ib.consumer, ids)
}

// commitEach runs the batch with a savepoint per item (none for a single
// item): a failure rolls back its item alone.
func (ib *Inbox) commitEach(ctx context.Context, items []Item, order []int) ([]Result, error) {
	results := make([]Result, len(items))
	savepoints := len(items) > 1
	err := ib.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, i := range order {
			if err := ib.commitItem(tx, items[i], &results[i], savepoints); err != nil {
				return err
			}
		}
		if !savepoints && results[0].Err != nil {
			return errRolledBack
		}
		return nil
	})
	if errors.Is(err, errRolledBack) {
		err = nil
	}
	return results, err
}

// errRolledBack rolls back a transaction whose only item failed.
var errRolledBack = errors.New("the only item failed")

// commitItem claims one item and applies it, recording a failure of its own in
// res; the error it returns breaks the whole transaction.
func (ib *Inbox) commitItem(tx *gorm.DB, it Item, res *Result, savepoint bool) error {
	if savepoint {
		if err := tx.Exec("SAVEPOINT inbox_item").Error; err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
	}
	fresh, err := ib.claim(tx, it.MessageID, it.Body)
	if err == nil && fresh && it.Apply != nil {
		err = it.Apply(tx)
	}
	if err != nil {
		res.Err = err
		if !savepoint {
			return nil // Commit rolls back
		}
		// A failed statement aborts the transaction (25P02) until this rollback.
		if rbErr := tx.Exec("ROLLBACK TO SAVEPOINT inbox_item").Error; rbErr != nil {
			return fmt.Errorf("roll back message %s: %w", it.MessageID, rbErr)
		}
		return nil
	}
	res.Fresh = fresh
	if savepoint {
		if err := tx.Exec("RELEASE SAVEPOINT inbox_item").Error; err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
	}
	return nil
}

// Process claims messageID and runs apply in the same transaction; it commits
// only if apply returns nil, and returns the commit error if the commit fails.
//
// If the id was already applied, Process returns fresh=false without calling
// apply. The claim is INSERT … ON CONFLICT DO NOTHING: a concurrent transaction
// holding the same id makes this one wait on the primary key, then see zero rows
// inserted once the first commits (or claim the id if the first rolls back). No
// unique-violation error is ever raised, so the transaction is never aborted.
func (ib *Inbox) Process(ctx context.Context, messageID string, body []byte, apply func(tx *gorm.DB) error) (fresh bool, err error) {
	res, err := ib.Commit(ctx, []Item{{MessageID: messageID, Body: body, Apply: apply}})
	if err != nil {
		return false, err
	}
	return res[0].Fresh, res[0].Err
}

func (ib *Inbox) claim(tx *gorm.DB, messageID string, body []byte) (bool, error) {
	sum := Fingerprint(body)
	res := tx.Exec(`INSERT INTO inbox (message_id, consumer, payload_sha256) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`,
		messageID, ib.consumer, sum)
	if res.Error != nil {
		return false, fmt.Errorf("claim message %s in inbox: %w", messageID, res.Error)
	}
	if res.RowsAffected == 1 {
		return true, nil
	}
	var stored []byte
	err := tx.Raw(`SELECT payload_sha256 FROM inbox WHERE message_id = ? AND consumer = ?`, messageID, ib.consumer).Row().Scan(&stored)
	if err != nil {
		return false, fmt.Errorf("read inbox entry of message %s: %w", messageID, err)
	}
	if !bytes.Equal(stored, sum) {
		return false, fmt.Errorf("message %s: %w", messageID, ErrPayloadMismatch)
	}
	return false, nil
}
