package buffered

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/pgqueue"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Incoming is a delivery to store.
type Incoming struct {
	MessageID   string
	OrderingKey string // "" makes the message a key of its own (see KeyOf)
	ContentType string
	Headers     map[string]any
	Body        []byte
	PublishedAt time.Time // zero: unknown
}

// KeyOf is the ordering key a message is stored under: the handler's key, or
// for a message without one a key of its own, so that it waits for nothing.
func KeyOf(orderingKey, messageID string) string {
	if orderingKey != "" {
		return orderingKey
	}
	return "message:" + messageID
}

// Stored is what became of one Incoming. Fresh means it was stored now;
// false with a nil Err means its id was stored before with the same body (a
// duplicate). Err is ErrPayloadMismatch if the id came before with another body.
type Stored struct {
	Fresh bool
	Err   error
}

// Ingest stores the items in one transaction, in the order given: each new
// message id is claimed in the inbox table, and each new message appended to
// its ordering key with the key's next sequence number. Messages of one key
// are therefore numbered in the order their transactions commit (the key's
// row stays locked from its update to the commit), and within one call in the
// order of items. beforeCommit, if set, runs after the writes, before COMMIT.
//
// A non-nil error means nothing was stored, whatever the results say.
func (s *Store) Ingest(ctx context.Context, items []Incoming, beforeCommit func()) ([]Stored, error) {
	results := make([]Stored, len(items))
	err := s.db.WithContext(ctx).Transaction(func(gtx *gorm.DB) error {
		tx, err := txOf(gtx)
		if err != nil {
			return err
		}
		in := ingestion{tx: tx, consumer: s.consumer}
		fresh, err := in.claimIDs(items, results)
		if err != nil {
			return err
		}
		if len(fresh) > 0 {
			seqs, err := in.appendToKeys(items, fresh)
			if err != nil {
				return err
			}
			if err := in.insertMessages(items, fresh, seqs); err != nil {
				return err
			}
		}
		if beforeCommit != nil {
			beforeCommit()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// ingestion is one Ingest's transaction, its steps in the order they run.
type ingestion struct {
	tx       *queryTx
	consumer string
}

// claimIDs inserts the distinct ids into the inbox, in id order (so that two
// transactions holding some of the same ids lock them in one order), and
// returns the indexes of the items that are new, in the order of items. The
// first of several items with one id is the one stored.
func (in ingestion) claimIDs(items []Incoming, results []Stored) ([]int, error) {
	first := map[string]int{}
	for i, it := range items {
		if _, ok := first[it.MessageID]; !ok {
			first[it.MessageID] = i
		}
	}
	ids := make([]string, 0, len(first))
	for id := range first {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var v values
	for _, id := range ids {
		v.row(id, in.consumer, inbox.Fingerprint(items[first[id]].Body))
	}
	claimed, err := in.tx.strings(`INSERT INTO inbox (message_id, consumer, payload_sha256) VALUES `+v.sql()+
		` ON CONFLICT DO NOTHING RETURNING message_id`, v.args...)
	if err != nil {
		return nil, fmt.Errorf("claim %d message ids in inbox: %w", len(ids), err)
	}
	known, err := in.knownFingerprints(ids, claimed)
	if err != nil {
		return nil, err
	}
	var fresh []int
	for i, it := range items {
		switch {
		case claimed[it.MessageID] && first[it.MessageID] == i:
			results[i].Fresh = true
			fresh = append(fresh, i)
		case claimed[it.MessageID]: // a second copy in this batch
			if !bytes.Equal(inbox.Fingerprint(items[first[it.MessageID]].Body), inbox.Fingerprint(it.Body)) {
				results[i].Err = fmt.Errorf("message %s: %w", it.MessageID, ErrPayloadMismatch)
			}
		case known[it.MessageID] == nil:
			// Pruned between the claim and the read: rare, and safe to try
			// again (the runtime's ingest reconnects and takes it again).
			return nil, fmt.Errorf("inbox entry of message %s vanished during ingest", it.MessageID)
		case !bytes.Equal(known[it.MessageID], inbox.Fingerprint(it.Body)):
			results[i].Err = fmt.Errorf("message %s: %w", it.MessageID, ErrPayloadMismatch)
		}
	}
	return fresh, nil
}

// knownFingerprints reads the stored fingerprints of the ids not claimed now.
func (in ingestion) knownFingerprints(ids []string, claimed map[string]bool) (map[string][]byte, error) {
	var old []string
	for _, id := range ids {
		if !claimed[id] {
			old = append(old, id)
		}
	}
	known := map[string][]byte{}
	if len(old) == 0 {
		return known, nil
	}
	rows, err := in.tx.query(`SELECT message_id, payload_sha256 FROM inbox WHERE consumer = $1 AND message_id = ANY($2)`, in.consumer, old)
	if err != nil {
		return nil, fmt.Errorf("read inbox entries of %d message ids: %w", len(old), err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var sum []byte
		if err := rows.Scan(&id, &sum); err != nil {
			return nil, err
		}
		known[id] = sum
	}
	return known, rows.Err()
}

// appendToKeys raises the sequence of every key the new messages belong to,
// keys in sorted order (so that concurrent ingests lock key rows in one
// order and cannot deadlock), and returns each new item's sequence number
// (the key's new messages numbered in the order of items) and whether it is
// its key's head: the key had nothing left to process, and this is its first
// new message. A head is due now; the others wait for the messages before
// them (insertMessages). The key's row stays locked to the commit, so a
// settlement that moves the key on waits for it and then sees these messages.
func (in ingestion) appendToKeys(items []Incoming, fresh []int) (map[int]position, error) {
	perKey := map[string][]int{}
	for _, i := range fresh {
		k := KeyOf(items[i].OrderingKey, items[i].MessageID)
		perKey[k] = append(perKey[k], i)
	}
	keys := make([]string, 0, len(perKey))
	for k := range perKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var v values
	for _, k := range keys {
		v.row(in.consumer, k, len(perKey[k]))
	}
	rows, err := in.tx.query(inboxQueue.Append(`VALUES `+v.sql()), v.args...)
	if err != nil {
		return nil, fmt.Errorf("append to %d ordering keys: %w", len(keys), err)
	}
	defer rows.Close()
	seqs := make(map[int]position, len(fresh))
	for rows.Next() {
		var k string
		var last, next int64
		if err := rows.Scan(&k, &last, &next); err != nil {
			return nil, err
		}
		idx := perKey[k]
		for n, i := range idx {
			seq := last - int64(len(idx)) + 1 + int64(n)
			seqs[i] = position{seq: seq, head: pgqueue.IsHead(seq, next)}
		}
	}
	return seqs, rows.Err()
}

// position is a new message's place in its key.
type position struct {
	seq  int64
	head bool // the key's next message to process: due now
}

func (in ingestion) insertMessages(items []Incoming, fresh []int, seqs map[int]position) error {
	var v values
	for _, i := range fresh {
		it := items[i]
		var published *time.Time
		if !it.PublishedAt.IsZero() {
			published = &it.PublishedAt
		}
		due := "infinity"
		if seqs[i].head {
			due = "now"
		}
		v.row(in.consumer, it.MessageID, KeyOf(it.OrderingKey, it.MessageID), seqs[i].seq,
			it.ContentType, rabbit.HeadersJSON(it.Headers), it.Body, published, due)
	}
	_, err := in.tx.exec(`INSERT INTO inbox_messages (consumer, message_id, ordering_key, seq, content_type, headers, body, published_at, available_at) VALUES `+
		v.sql(), v.args...)
	if err != nil {
		return fmt.Errorf("store %d messages: %w", len(fresh), err)
	}
	return nil
}
