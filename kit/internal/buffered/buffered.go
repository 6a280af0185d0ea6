// Package buffered is the buffered inbox: a delivery is stored in PostgreSQL
// and acked at once (Ingest), then processed from the table by workers that
// claim one message per ordering key at a time (Claim), with a status every
// operator can query in SQL. The inbox table still dedupes message ids at
// ingest; this package adds the stored messages (inbox_messages) and a row per
// ordering key (inbox_keys) holding the key's sequence and a pointer to its
// head, the next message to process.
//
// It is the outbox's queue on the inbox's tables (docs/message-flow.md): only
// a key's head is ever due, the messages behind it wait at available_at =
// 'infinity', and the settlement of the head makes its successor due. A claim
// leases a message: it moves the message's available_at to the end of the
// lease and writes a token; everything that settles the message later checks
// the token in the same statement, so a worker whose lease passed to another
// one (it crashed, or outlived the lease) can commit nothing. An expired lease
// makes the message due again with no sweeper.
package buffered

import (
	"errors"

	"gorm.io/gorm"
)

// Status is where a stored message stands.
type Status string

// Statuses. A message is pending until a worker claims it (processing); it
// ends processed, or failed with attempts left (tried again at its
// available_at), or parked: its retry budget is spent or its error is
// permanent, and as the head of its key it blocks the key until an operator
// retries, skips (skipped) or exports it to the dead-letter queue
// (dead_lettered).
const (
	StatusPending      Status = "pending"
	StatusProcessing   Status = "processing"
	StatusProcessed    Status = "processed"
	StatusFailed       Status = "failed"
	StatusParked       Status = "parked"
	StatusSkipped      Status = "skipped"
	StatusDeadLettered Status = "dead_lettered"
)

// Statuses lists every status, unfinished ones first.
var Statuses = []Status{StatusPending, StatusProcessing, StatusFailed, StatusParked, StatusProcessed, StatusSkipped, StatusDeadLettered}

// ErrPayloadMismatch means a message id was stored before with a different
// body: the producer reused an id.
var ErrPayloadMismatch = errors.New("message id already stored with a different payload")

// Store keeps the buffered messages of one consumer.
type Store struct {
	db       *gorm.DB
	consumer string
}

// New returns the store of consumer; several consumers can share the tables.
func New(db *gorm.DB, consumer string) *Store {
	return &Store{db: db, consumer: consumer}
}

// Consumer is the consumer whose messages the store keeps.
func (s *Store) Consumer() string { return s.consumer }

// taken for another's.
