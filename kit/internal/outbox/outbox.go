// Package outbox is the kit's transactional outbox: a handler adds the
// messages it emits to the outbox table from its writes, through the same
// transaction as the inbox row and its business writes, so that they leave
// exactly when those commit; the relay (Relay) publishes the committed rows
// with publisher confirms and marks them sent only after the broker confirmed
// them. Each message gets its id at insert, a UUID that is the AMQP
// message_id of every publish of it: a republish after a crash between the
// confirm and the mark carries the same id, for the next consumer's inbox to
// suppress.
package outbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// Message is one message to emit.
type Message struct {
	Exchange    string
	RoutingKey  string
	ContentType string // "" means application/json
	Headers     map[string]any
	Body        []byte
	// OrderingKey, if set, publishes the messages of one key one at a time,
	// in the order their transactions committed, across replicas and
	// restarts; "" publishes the message as soon as possible (the fastest).
	OrderingKey string
	// Optional publishes the message even if no queue is bound for it (the
	// broker drops it: an announcement nobody subscribes to yet). By default
	// a message no queue takes is a failure, retried and then parked.
	Optional bool
}

// Outbox adds messages to the outbox table of one producer (the service).
// Safe for concurrent use.
type Outbox struct {
	producer  string
	exchanges []string // those the relay declares; nil takes any
	wake      chan struct{}
	tracer    *tracing.Tracer
}

// New returns the outbox of producer, the service's name. With exchanges
// (the service's Publishes, which the relay declares), Enqueue refuses a
// message to any other but the default exchange: the broker would close the
// relay's channel on it (404) at every try.
func New(producer string, exchanges ...string) *Outbox {
	return &Outbox{producer: producer, exchanges: exchanges, wake: make(chan struct{}, 1)}
}

// Traced makes each row carry the trace context of the transaction that
// added it (its headers' traceparent), and the relay's publish of it a
// producer span that continues that trace; t nil: none.
func (o *Outbox) Traced(t *tracing.Tracer) *Outbox {
	o.tracer = t
	return o
}

// Producer is the name the outbox's rows carry.
func (o *Outbox) Producer() string { return o.producer }

// maxKeyLen bounds an ordering key, as the inbox bounds a message id.
const maxKeyLen = 255

// Enqueue adds msgs to the outbox through tx, the transaction of a handler's
// writes, and returns their ids (the message_id each will be published
// with). They commit with tx or not at all. Within the writes of the consumer
// runtime, the relay of this process is woken once the transaction commits;
// from a transaction of the caller's own, call Wake after its commit (else
// the relay finds the rows at its next poll).
//
// An ordered message takes its key's next sequence number under a lock on
// the key's row, held until tx ends: transactions emitting to one key commit
// one after the other.
//
// Given the very tx of a handler's writes in a group commit, Enqueue only
// validates the messages and gives them their ids: their rows are inserted
// with those of the batch's other messages, by one statement just before the
// COMMIT, in the order of the calls (inbox.Defer). If that statement fails,
// the batch runs again with a savepoint per message, where Enqueue inserts at
// once and the failure stays with its message. A tx of the writes' own making
// (tx.Transaction, tx.WithContext) inserts at once.
func (o *Outbox) Enqueue(ctx context.Context, tx *gorm.DB, msgs ...Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	for i, m := range msgs {
		if err := m.validate(); err != nil {
			return nil, fmt.Errorf("outbox message %d: %w", i, err)
		}
		if m.Exchange != "" && o.exchanges != nil && !slices.Contains(o.exchanges, m.Exchange) {
			return nil, fmt.Errorf("outbox message %d: exchange %q is not one the service publishes to (kit.Service.Publishes: %q)", i, m.Exchange, o.exchanges)
		}
	}
	ids := make([]string, len(msgs))
	for i := range msgs {
		ids[i] = newID()
	}
	msgs = o.traced(ctx, msgs)
	// In a group commit the rows of every message of the batch are inserted
	// together, by one statement just before its COMMIT (inbox.Defer).
	if p, ok := inbox.Defer(tx, o, func() *pending { return &pending{o: o} }); ok {
		p.msgs, p.ids = append(p.msgs, msgs...), append(p.ids, ids...)
		consumer.OnCommit(ctx, o.Wake)
		return ids, nil
	}
	if err := o.insert(tx.WithContext(ctx), msgs, ids); err != nil {
		return nil, err
	}
	consumer.OnCommit(ctx, o.Wake)
	return ids, nil
}

// traced gives msgs (a copy, with copies of their headers) ctx's trace
// context, when there is one to carry.
func (o *Outbox) traced(ctx context.Context, msgs []Message) []Message {
	if o.tracer == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return msgs
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		h := make(map[string]any, len(m.Headers)+2)
		maps.Copy(h, m.Headers)
		m.Headers = o.tracer.Inject(ctx, h)
		out[i] = m
	}
	return out
}

// pending are the messages a batch's items enqueued, to insert before its COMMIT.
type pending struct {
	o    *Outbox
	msgs []Message
	ids  []string
}

func (p *pending) Flush(tx *gorm.DB) error { return p.o.insert(tx, p.msgs, p.ids) }

// insertMax bounds the messages of one insert statement: 9 parameters each,
// below PostgreSQL's 65,535 per statement.
const insertMax = 5000

// insert writes the rows of msgs, with their ids, in one statement per
// insertMax of them, in order.
func (o *Outbox) insert(tx *gorm.DB, msgs []Message, ids []string) error {
	for len(msgs) > insertMax {
		if err := o.insertOne(tx, msgs[:insertMax], ids[:insertMax]); err != nil {
			return err
		}
		msgs, ids = msgs[insertMax:], ids[insertMax:]
	}
	return o.insertOne(tx, msgs, ids)
}

func (o *Outbox) insertOne(tx *gorm.DB, msgs []Message, ids []string) error {
	var v values
	for i, m := range msgs {
		ct := m.ContentType
		if ct == "" {
			ct = "application/json"
		}
		var key any
		if m.OrderingKey != "" {
			key = m.OrderingKey
		}
		body := m.Body
		if body == nil { // an empty message, not a NULL
			body = []byte{}
		}
		v.row(i, ids[i], m.Exchange, m.RoutingKey, ct, rabbit.HeadersJSON(m.Headers), body, !m.Optional, key)
	}
	// One statement, one round trip: the messages (m), the sequence of
	// their ordering keys raised under each key row's lock (k: keys in
	// byte order within the call, as MarkSent takes them, so that two
	// transactions lock the keys they share in one order; see the
	// deadlocks in docs/outbox.md), then the rows: an ordered message's
	// number follows its key's last, in the call's order, and only its
	// key's head (the first not yet sent) is due now, the others waiting
	// at infinity.
	err := tx.Exec(`WITH m (idx, id, exchange, routing_key, content_type, headers, body, mandatory, ordering_key) AS (
			VALUES `+v.sql("(?::int, ?::uuid, ?::text, ?::text, ?::text, ?::jsonb, ?::bytea, ?::boolean, ?::text)")+`
		), ranked AS (
			SELECT m.*, row_number() OVER (PARTITION BY ordering_key ORDER BY idx) AS nth,
				count(*) OVER (PARTITION BY ordering_key) AS of_key
			FROM m
		), k AS (
			`+outboxQueue.Append(`SELECT ?, ordering_key, count(*) FROM m WHERE ordering_key IS NOT NULL
			GROUP BY ordering_key ORDER BY ordering_key COLLATE "C"`)+`
		)
		INSERT INTO outbox (id, producer, exchange, routing_key, content_type, headers, body, mandatory, ordering_key, seq, available_at)
		SELECT r.id, ?, r.exchange, r.routing_key, r.content_type, r.headers, r.body, r.mandatory, r.ordering_key, q.seq,
			CASE WHEN q.seq IS NULL OR q.seq = k.next_seq THEN now() ELSE 'infinity'::timestamptz END
		FROM ranked r LEFT JOIN k ON k.ordering_key = r.ordering_key
		CROSS JOIN LATERAL (SELECT k.last_seq - r.of_key + r.nth AS seq) q
		ORDER BY r.idx`, append(v.args, o.producer, o.producer)...).Error
	if err != nil {
		return fmt.Errorf("enqueue %d outbox messages: %w", len(msgs), err)
	}
	return nil
}

// Wake tells this process's relay that messages were committed.
func (o *Outbox) Wake() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// validate refuses a message the relay could never publish: AMQP carries
// the exchange, the routing key, the content type and each header's name
// (nested ones too) as short strings of 255 bytes at most, and the
// properties and headers in one frame.
func (m Message) validate() error {
	switch {
	case m.RoutingKey == "" && m.Exchange == "":
		return errors.New("no exchange and no routing key")
	case len(m.OrderingKey) > maxKeyLen || !utf8.ValidString(m.OrderingKey) || strings.ContainsFunc(m.OrderingKey, unicode.IsControl):
		return errors.New("ordering key longer than 255 bytes, not UTF-8, or with a control character")
	}
	if err := rabbit.CheckHeaderNames(m.Headers); err != nil {
		return err
	}
	// The headers as stored and published (HeadersJSON: a time, a byte
	// array become strings).
	var headers amqp.Table
	if len(m.Headers) > 0 {
		var err error
		if headers, err = rabbit.HeadersFromJSON([]byte(rabbit.HeadersJSON(m.Headers))); err != nil {
			return err
		}
	}
	return rabbit.CheckPublishing(m.Exchange, m.RoutingKey, amqp.Publishing{ContentType: m.ContentType, Headers: headers}, maxHeaderFrame)
}

// maxHeaderFrame bounds the frame of a message's properties and headers at
// Enqueue: half of RabbitMQ's default frame_max (128 KiB), room for what the
// relay adds (its id, the publish time, a trace context). The relay checks
// each row against the frame size its connection negotiated, and parks one
// that does not fit (a broker with a smaller frame_max).
const maxHeaderFrame = 64 << 10

// values builds the VALUES list of a multi-row statement.
type values struct {
	rows int
	args []any
}

func (v *values) row(cols ...any) {
	v.rows++
	v.args = append(v.args, cols...)
}

func (v *values) sql(row string) string {
	return strings.TrimSuffix(strings.Repeat(row+", ", v.rows), ", ")
}

// newID is a UUID version 7: the time in milliseconds, then randomness, so
// that ids inserted together sit together in the primary key's index.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16|uint64(binary.BigEndian.Uint16(b[6:8])))
	b[6] = b[6]&0x0f | 0x70 // version 7
	b[8] = b[8]&0x3f | 0x80 // variant 10
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
