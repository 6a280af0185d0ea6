// Package inbox is the transactional inbox: it records each message id a consumer
// has applied in the same PostgreSQL transaction as the message's effects, so a
// redelivered message is recognised and its effects are never applied twice.
package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
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
	return &Inbox{db: db, consumer: consumer}
}

// Fingerprint is the SHA-256 of a message body.
func Fingerprint(body []byte) []byte {
	sum := sha256.Sum256(body)
	return sum[:]
}

// Seen reports whether messageID was already applied, with a plain read that
// takes no lock: a known duplicate can then skip the handler and its outside
// calls. It returns ErrPayloadMismatch if the id was applied with another body.
// A false answer is only a hint: the claim in Commit decides.
func (ib *Inbox) Seen(ctx context.Context, messageID string, body []byte) (bool, error) {
	var seen Entry
	err := ib.db.WithContext(ctx).Select("payload_sha256").
		Where("message_id = ? AND consumer = ?", messageID, ib.consumer).Limit(1).Find(&seen).Error
	switch {
	case err != nil:
		return false, fmt.Errorf("look up message %s in inbox: %w", messageID, err)
	case seen.PayloadSHA256 == nil:
		return false, nil
	case !bytes.Equal(seen.PayloadSHA256, Fingerprint(body)):
		return false, fmt.Errorf("message %s: %w", messageID, ErrPayloadMismatch)
	}
	return true, nil
}

// Item is one message to commit: its id and body, and the writes that must
// commit together with its inbox row. Apply runs only if the id is claimed now
// (not applied before); nil Apply commits the inbox row alone.
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
// COMMIT, and so one WAL flush, for all of them. Each item of a batch runs
// under its own savepoint, so an item whose claim or writes fail is rolled back
// alone and reported in its Result while the others commit. A non-nil error
// means the transaction as a whole failed (begin, savepoint or COMMIT): then
// nothing of any item was committed, whatever the Results say.
//
// Items are claimed in message-id order, so that two batches holding some of
// the same ids (duplicates on two replicas) take the row locks in one order.
func (ib *Inbox) Commit(ctx context.Context, items []Item) ([]Result, error) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(items[a].MessageID, items[b].MessageID) })
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
	res := tx.Clauses(clause.OnConflict{DoNothing: true}).
		Create(&Entry{MessageID: messageID, Consumer: ib.consumer, PayloadSHA256: sum})
	if res.Error != nil {
		return false, fmt.Errorf("claim message %s in inbox: %w", messageID, res.Error)
	}
	if res.RowsAffected == 1 {
		return true, nil
	}
	var seen Entry
	err := tx.Select("payload_sha256").
		Where("message_id = ? AND consumer = ?", messageID, ib.consumer).Take(&seen).Error
	if err != nil {
		return false, fmt.Errorf("read inbox entry of message %s: %w", messageID, err)
	}
	if !bytes.Equal(seen.PayloadSHA256, sum) {
		return false, fmt.Errorf("message %s: %w", messageID, ErrPayloadMismatch)
	}
	return false, nil
}
