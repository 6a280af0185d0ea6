package kit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing/fstest"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit"
)

// A service declares its dead-letter reasons once, at package level: a
// malformed word panics as the program starts, never at run time.
var (
	ReasonMalformedJSON  = kit.NewReason("malformed_json")
	ReasonInvalidAmount  = kit.NewReason("invalid_amount")
	CauseLedgerForbidden = kit.NewCause("ledger_forbidden")
)

// InvoiceDue is the event of the examples.
type InvoiceDue struct {
	EventID     string `json:"event_id"`
	InvoiceID   string `json:"invoice_id"`
	AmountCents int64  `json:"amount_cents"`
}

// DecodeInvoiceDue refuses what no retry can fix, with a reason: the
// message is dead-lettered before any handler runs.
func DecodeInvoiceDue(body []byte) (InvoiceDue, error) {
	var ev InvoiceDue
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, kit.Permanent(ReasonMalformedJSON, err)
	}
	if ev.AmountCents <= 0 {
		return ev, kit.Permanent(ReasonInvalidAmount, fmt.Errorf("amount_cents %d", ev.AmountCents))
	}
	return ev, nil
}

// Ledger is a service outside the database, called with an idempotency key.
type Ledger struct{}

// Post records an invoice in the ledger once per key.
func (Ledger) Post(ctx context.Context, key string) (string, error) { return "entry-" + key, nil }

// Invoices handles InvoiceDue events: a kit.Handler[InvoiceDue].
type Invoices struct {
	post   func(ctx context.Context, key string) (string, error)
	outbox *kit.Outbox
}

// Handle calls out with no transaction open, keyed by the business entity,
// then returns the writes the kit runs in the inbox transaction.
func (h *Invoices) Handle(ctx context.Context, msg kit.Message, ev InvoiceDue) (kit.Writes, error) {
	entry, err := h.post(ctx, "invoice:"+ev.InvoiceID)
	if err != nil {
		return nil, err // retried with backoff, then dead-lettered
	}
	return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
		res := tx.Exec(`INSERT INTO invoices (invoice_id, entry, message_id) VALUES (?, ?, ?)
			ON CONFLICT DO NOTHING`, ev.InvoiceID, entry, msg.ID)
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0: // the same invoice under another message id: emitted already
			return kit.OutcomeDuplicate, nil
		}
		// An event emitted with the effect: published by the relay after
		// the commit.
		if _, err := h.outbox.Enqueue(ctx, tx, kit.OutboxMessage{
			Exchange: "billing", RoutingKey: "invoice.posted", Body: []byte(`{"invoice_id":"` + ev.InvoiceID + `"}`), OrderingKey: ev.InvoiceID,
		}); err != nil {
			return "", err
		}
		return kit.OutcomeProcessed, nil
	}, nil
}

// migrationFiles holds the service's schema. In a service:
//
//	//go:embed migrations/*.sql
//	var migrationFiles embed.FS
var migrationFiles = fstest.MapFS{"migrations/00001_invoices.sql": {Data: []byte(`-- +goose Up
CREATE TABLE invoices (invoice_id text PRIMARY KEY, entry text NOT NULL, message_id text NOT NULL);
-- +goose Down
DROP TABLE invoices;
`)}}

// A service is its description, its events and its handler's constructor,
// all typed to one event: a handler of another event does not compile. Its
// main runs it with kit.Run(ctx, Service(), os.Args[1:], os.Stdin, os.Stdout).
func ExampleConsume() {
	service := kit.Consume(kit.Service{
		Name:       "invoice-service",
		Event:      "invoice-due",
		Exchange:   "billing",
		RoutingKey: "invoice.due",
		Publishes:  []string{"billing"},
		Migrations: []kit.MigrationSet{kit.Migrations("invoice-service", migrationFiles, "migrations")},
	},
		kit.Events[InvoiceDue]{
			Decode:      DecodeInvoiceDue,
			ID:          func(e InvoiceDue) string { return e.EventID },
			OrderingKey: func(e InvoiceDue) string { return e.InvoiceID },
		},
		func(d *kit.Deps) (kit.Handler[InvoiceDue], error) {
			return &Invoices{
				post:   kit.OutsideCall(d, "ledger post", "after-ledger-post", Ledger{}.Post),
				outbox: d.Outbox,
			}, nil
		})
	fmt.Println(service.Name, service.Event)
	// Output: invoice-service invoice-due
}

// InvoiceVoided is a second event of the invoice service.
type InvoiceVoided struct {
	EventID   string `json:"event_id"`
	InvoiceID string `json:"invoice_id"`
}

// Voids handles InvoiceVoided events: a kit.Handler[InvoiceVoided].
type Voids struct{}

// Handle marks the invoice void; it has no outside call.
func (Voids) Handle(ctx context.Context, msg kit.Message, ev InvoiceVoided) (kit.Writes, error) {
	return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
		return kit.OutcomeProcessed, tx.Exec(`UPDATE invoices SET void = true WHERE invoice_id = ?`, ev.InvoiceID).Error
	}, nil
}

// A service that consumes a second event adds it with its own binding key,
// its own Events (dedupe and ordering key) and its own typed handler: the
// work queue is bound to both keys, each message reaches the handler of its
// key, and in the buffered mode a void comes after its invoice (one
// ordering key, the invoice's id, across both events).
func ExampleConsumeAlso() {
	service := kit.Consume(kit.Service{
		Name: "invoice-service", Event: "invoice-due", Exchange: "billing", RoutingKey: "invoice.due",
		Migrations: []kit.MigrationSet{kit.Migrations("invoice-service", migrationFiles, "migrations")},
	},
		kit.Events[InvoiceDue]{
			Decode:      DecodeInvoiceDue,
			ID:          func(e InvoiceDue) string { return e.EventID },
			OrderingKey: func(e InvoiceDue) string { return e.InvoiceID },
		},
		func(d *kit.Deps) (kit.Handler[InvoiceDue], error) {
			return &Invoices{post: kit.OutsideCall(d, "ledger post", "after-ledger-post", Ledger{}.Post), outbox: d.Outbox}, nil
		})
	service = kit.ConsumeAlso(service, kit.Binding{Key: "invoice.voided"},
		kit.Events[InvoiceVoided]{
			Decode: func(body []byte) (InvoiceVoided, error) {
				var ev InvoiceVoided
				if err := json.Unmarshal(body, &ev); err != nil {
					return ev, kit.Permanent(ReasonMalformedJSON, err)
				}
				return ev, nil
			},
			ID:          func(e InvoiceVoided) string { return e.EventID },
			OrderingKey: func(e InvoiceVoided) string { return e.InvoiceID },
		},
		func(d *kit.Deps) (kit.Handler[InvoiceVoided], error) { return Voids{}, nil })
	cfg, err := kit.LoadConfig(service)
	fmt.Println(cfg.Queue, "bound to", cfg.RoutingKey, cfg.MoreBindings, err)
	// Output: invoice-service.invoice-due bound to invoice.due [{billing invoice.voided}] <nil>
}

// The reason of a permanent error is a declared value: the kit dead-letters
// the message with it (its x-dead-letter-reason header, the reason label of
// consumer_dead_letters_total).
func ExamplePermanent() {
	_, err := DecodeInvoiceDue([]byte(`{"event_id":"e-1","invoice_id":"inv-1","amount_cents":-5}`))
	fmt.Println(err)
	// Output: invalid_amount: amount_cents -5
}

// A pause says a dependency fails for every message alike: the message goes
// back without spending an attempt and consumption pauses.
func ExamplePause() {
	err := kit.Pause(CauseLedgerForbidden, fmt.Errorf("ledger answered 403"))
	fmt.Println(err)
	// Output: ledger_forbidden: ledger answered 403
}

// carrierConfig is a tool's configuration: a program beside the services
// (here a fake callee) that reads its environment the kit's way.
type carrierConfig struct {
	HTTPAddr string `envconfig:"CARRIER_HTTP_ADDR" default:":8082" desc:"where the carrier listens"`
	LogLevel string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	Token    string `envconfig:"CARRIER_TOKEN" secret:"true" desc:"the bearer token of its fault endpoints"`
}

// Validate refuses bad values, each error naming its variable.
func (c *carrierConfig) Validate() error {
	var v kit.Checks
	v.Require(kit.ValidLogLevel(c.LogLevel), "LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	return v.Err()
}

func ExampleLoadEnv() {
	os.Setenv("LOG_LEVEL", "loud")
	os.Setenv("CARRIER_TOKEN", "s3cret")
	defer os.Unsetenv("LOG_LEVEL")
	defer os.Unsetenv("CARRIER_TOKEN")
	var cfg carrierConfig
	fmt.Println(kit.LoadEnv(&cfg))
	os.Setenv("LOG_LEVEL", "warn")
	fmt.Println(kit.LoadEnv(&cfg), kit.LogValue(&cfg))
	// Output:
	// configuration: invalid LOG_LEVEL: must be debug, info, warn or error, got "loud"
	// <nil> map[CARRIER_HTTP_ADDR::8082 CARRIER_TOKEN:*** LOG_LEVEL:warn]
}
