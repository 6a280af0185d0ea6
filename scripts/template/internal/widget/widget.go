// Package widget is widget-service: it consumes WidgetOrdered events from the widgets
// exchange (binding key widget.ordered) and records each one exactly once.
// Written by scripts/new-project.sh from its template (scripts/template); the
// TODOs mark what is yours to write.
// The template's docs/writing-a-service.md explains every part, and its
// shipping example is a service with an outside call.
package widget

import (
	"context"
	"embed"
	"encoding/json"
	"log/slog"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/inbox-template/payment-service/kit"
)

// WidgetOrdered is the event this service consumes. TODO: its fields, as the
// producer sends them.
type WidgetOrdered struct {
	EventID string `json:"event_id"`
	// Key names the business entity the event is about (an order, an
	// account): the unique key of the service's effect, and the ordering key
	// of the buffered mode.
	Key string `json:"key"`
}

// Record is one row of the widget_records table: the service's effect, one per key.
type Record struct {
	Key       string `gorm:"primaryKey"`
	MessageID string
}

// TableName is the table the migration creates.
func (Record) TableName() string { return "widget_records" }

// The service's dead-letter (buffered: park) reasons, declared once: a word
// not of the form of one stops the program as it starts.
var (
	ReasonMalformedJSON = kit.NewReason("malformed_json")
	ReasonMissingField  = kit.NewReason("missing_field")
)

// DecodeWidgetOrdered decodes and validates a body. A body it refuses is
// dead-lettered (the buffered inbox: parked, a key of its own) with the
// reason given here, before any handler runs, and never retried: refuse here
// what no retry can fix.
func DecodeWidgetOrdered(body []byte) (WidgetOrdered, error) {
	var ev WidgetOrdered
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, kit.Permanent(ReasonMalformedJSON, err)
	}
	if ev.Key == "" {
		return ev, kit.Permanent(ReasonMissingField, nil)
	}
	return ev, nil
}

// Handler handles WidgetOrdered events, on up to WORKERS goroutines at once. The
// contract (the kit keeps its side of it):
//   - Handle runs with no transaction open, at least once per message: a
//     redelivery after a crash runs it again, and so may a second replica.
//     An outside call made here must be idempotent, with a key derived
//     from the business entity (ev.Key), never from the message or a fresh
//     gen:if outside-calls
//     one; the kit keeps the retries and dlq replay within
//     IDEMPOTENCY_KEY_TTL (default 24h: set it to what the service you call
//     promises), so that no retry comes after the callee forgot the key.
//     gen:else
//     one. This service was generated with --no-outside-calls: set
//     NoOutsideCalls to false in Service before Handle calls out, or nothing
//     keeps the retries within the callee's memory of the key.
//     gen:end
//   - An error from Handle or from the writes is retried with backoff and
//     then dead-lettered (the buffered mode: parked); one wrapped with
//     kit.Permanent is dead-lettered (parked) at once with its reason. A fault of
//     the database is not the message's: it is put back without spending an
//     attempt.
//   - The writes run in the inbox transaction: everything through tx commits
//     together with the message's inbox row, or nothing does. They may run
//     again (a rolled-back batch is retried) or not at all (the inbox row
//     exists: a duplicate), so they touch nothing but tx.
//   - The writes return the outcome: OutcomeProcessed, or OutcomeDuplicate
//     when the effect was already there (the same key under another message
//     id); an empty outcome is refused. Nothing to write: kit.NoWrites.
//   - One message id, one body: a message whose id was seen with other bytes
//     (a producer that re-serialized it) is dead-lettered payload_mismatch.
//
// gen:if publishes
type Handler struct {
	// outbox emits the service's events from the writes, in the inbox
	// transaction: the relay publishes them once committed.
	outbox *kit.Outbox
}

// gen:else
// gen> type Handler struct{}
// gen:end

// Handle takes the event Events made of the body (decoded once,
// before the handler runs) and returns its writes.
func (h *Handler) Handle(ctx context.Context, msg kit.Message, ev WidgetOrdered) (kit.Writes, error) {
	// gen:if outside-calls
	// TODO: the business logic. An outside call goes here, before the
	// writes, with no transaction open.
	// gen:else
	// TODO: the business logic. No outside call here while Service
	// declares NoOutsideCalls: true.
	// gen:end
	return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&Record{Key: ev.Key, MessageID: msg.ID})
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0: // the same key under another message id
			return kit.OutcomeDuplicate, nil
		}
		// gen:if publishes
		// The event goes out with the record: enqueued in this
		// transaction, published by the outbox relay after the commit,
		// confirmed by the broker, one key's events in order, at least
		// once (a consumer dedupes by its message id). An event no queue
		// is bound for is refused by the broker, retried and then parked
		// (widget-service outbox parked, retry): bind the consumers' queues first,
		// or set Optional for an announcement nobody need take yet.
		body, err := json.Marshal(map[string]string{"key": ev.Key, "message_id": msg.ID})
		if err != nil {
			return "", err
		}
		if _, err := h.outbox.Enqueue(ctx, tx, kit.OutboxMessage{
			Exchange: "widget-events", RoutingKey: "widget.recorded", Body: body, OrderingKey: ev.Key,
		}); err != nil {
			return "", err
		}
		// gen:end
		return kit.OutcomeProcessed, nil
	}, nil
}

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Events is how the service reads WidgetOrdered: each body is decoded once,
// before the handler runs; a body without a message_id property is deduped
// by its event_id. The handler is typed to the same event: one of another
// does not compile, in Service as in kittest.CheckWrites(t, db, Events, h, msg).
var Events = kit.Events[WidgetOrdered]{
	Decode:      DecodeWidgetOrdered,
	ID:          func(e WidgetOrdered) string { return e.EventID },
	OrderingKey: func(e WidgetOrdered) string { return e.Key },
}

// Service describes widget-service to the kit. Its queues are derived:
// widget-service.widget-ordered, widget-service.dlx, widget-service.widget-ordered.dlq and the retry queues.
func Service() kit.Service {
	return kit.Consume(kit.Service{
		Name:       "widget-service",
		Event:      "widget-ordered",
		Exchange:   "widgets",
		RoutingKey: "widget.ordered",
		Migrations: []kit.MigrationSet{kit.Migrations("widget-service", migrationFiles, "migrations")},
		LogAttrs: func(body []byte) []slog.Attr {
			var ev WidgetOrdered
			if json.Unmarshal(body, &ev) != nil {
				return nil
			}
			return []slog.Attr{slog.String("key", ev.Key)}
		},
		// gen:if outside-calls
		// false: the handler may call out, and the kit keeps its retries
		// and dlq replay within IDEMPOTENCY_KEY_TTL, how long the services
		// it calls remember an idempotency key (the key-expiry guard). true
		// turns the guard off: only for a handler that calls nothing outside
		// its database (scripts/new-project.sh --no-outside-calls).
		NoOutsideCalls: false,
		// gen:else
		// gen> // true (generated with --no-outside-calls): the handler calls
		// gen> // nothing outside its database, so no idempotency key can expire:
		// gen> // no key-expiry guard, no replay age limit, IDEMPOTENCY_KEY_TTL
		// gen> // refused. Set it to false before Handle calls out, or a retry after
		// gen> // the callee forgot the key repeats the side effect.
		// gen> NoOutsideCalls: true,
		// gen:end
		// gen:if ordered
		// --ordered: one key's events are processed in the order they
		// were published (the Events' OrderingKey), so the service requires
		// the buffered inbox (INBOX_MODE=buffered: each message is stored
		// and acked at once, then processed from the table a key at a
		// time) and a single active consumer (SINGLE_ACTIVE_CONSUMER: one
		// replica consumes the queue at a time, so the replicas store one
		// key's messages in the broker's order; the broker fixes it when it
		// first declares the queue). A message that fails for good is
		// parked and blocks its key until an operator acts (widget-service inbox
		// retry, skip or export); a body the decoder refuses is parked as
		// a key of its own.
		Requires: kit.Requirements{Mode: kit.ModeBuffered, SingleActiveConsumer: true},
		// gen:else
		// gen> // Unordered: the inline inbox (INBOX_MODE, inline by default)
		// gen> // processes each message as its delivery waits. For one key's events
		// gen> // in the order they were published, require the buffered inbox and
		// gen> // a single active consumer:
		// gen> // Requires: kit.Requirements{Mode: kit.ModeBuffered, SingleActiveConsumer: true}
		// gen> // (scripts/new-project.sh --ordered).
		// gen:end
		// gen:if publishes
		// The exchanges it emits to through d.Outbox (the relay declares
		// them).
		Publishes: []string{"widget-events"},
		// gen:end
	},
		Events,
		// d holds what a handler may keep: d.Reader for reads outside the
		// transaction, d.Outbox to emit events from the writes (with
		// Publishes naming their exchanges), d.Config; an outside call is
		// declared with kit.OutsideCall(d, …), traced, with its crash point.
		func(d *kit.Deps) (kit.Handler[WidgetOrdered], error) {
			// gen:if publishes
			return &Handler{outbox: d.Outbox}, nil
			// gen:else
			// gen> return &Handler{}, nil
			// gen:end
		})
}
