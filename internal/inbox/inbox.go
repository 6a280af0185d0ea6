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

// Process claims messageID and runs apply in the same transaction; it commits
// only if apply returns nil, and returns the commit error if the commit fails.
//
// If the id was already applied, Process returns fresh=false without calling
// apply. The claim is INSERT … ON CONFLICT DO NOTHING: a concurrent transaction
// holding the same id makes this one wait on the primary key, then see zero rows
// inserted once the first commits (or claim the id if the first rolls back). No
// unique-violation error is ever raised, so the transaction is never aborted.
func (ib *Inbox) Process(ctx context.Context, messageID string, body []byte, apply func(tx *gorm.DB) error) (fresh bool, err error) {
	err = ib.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		fresh, err = ib.claim(tx, messageID, body)
		if err != nil || !fresh {
			return err
		}
		return apply(tx)
	})
	if err != nil {
		return false, err
	}
	return fresh, nil
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
