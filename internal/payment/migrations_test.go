package payment_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/migrations"
)

func openSQL(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The payments schema applies once; applied again, it finds nothing to do.
func TestMigrationsApplyTwice(t *testing.T) {
	db := openSQL(t, kittest.Postgres(t))
	ctx := context.Background()
	first, err := migrations.Apply(ctx, db, payment.Migrations)
	if err != nil || len(first[payment.Migrations.Name()]) == 0 {
		t.Fatalf("first apply: %v %v", first, err)
	}
	second, err := migrations.Apply(ctx, db, payment.Migrations)
	if err != nil || len(second[payment.Migrations.Name()]) != 0 {
		t.Fatalf("second apply: applied %v, err %v; want nothing, no error", second, err)
	}
}

// legacySchema is the payments database as the first release migrated it:
// one goose set, in goose's default table, holding the inbox and payments.
const legacySchema = `-- +goose Up
CREATE TABLE inbox (
    message_id     text        NOT NULL CHECK (message_id <> ''),
    consumer       text        NOT NULL CHECK (consumer <> ''),
    payload_sha256 bytea       NOT NULL CHECK (octet_length(payload_sha256) = 32),
    received_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, consumer)
);
CREATE INDEX inbox_received_at_idx ON inbox (received_at);
CREATE TABLE payments (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id       text        NOT NULL UNIQUE,
    message_id     text        NOT NULL,
    customer_id    text        NOT NULL,
    amount_cents   bigint      NOT NULL CHECK (amount_cents > 0),
    currency       char(3)     NOT NULL,
    status         text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    charge_id      text        NOT NULL,
    decline_reason text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
-- +goose Down
DROP TABLE payments;
DROP TABLE inbox;
`

// A database migrated by the first release (one set in goose_db_version) takes
// the split schemas without error and keeps its rows.
func TestLegacyDatabaseUpgrades(t *testing.T) {
	db := openSQL(t, kittest.Postgres(t))
	ctx := context.Background()
	legacy := fstest.MapFS{"00001_inbox_and_payments.sql": {Data: []byte(legacySchema)}}
	p, err := goose.NewProvider(goose.DialectPostgres, db, legacy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO inbox VALUES ('m1', 'payment-service', sha256('x'), now())`); err != nil {
		t.Fatal(err)
	}
	applied, err := migrations.Apply(ctx, db, migrations.Inbox, payment.Migrations)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if len(applied["inbox"]) != 1 || len(applied["payments"]) != 1 {
		t.Fatalf("applied %v, want version 1 of each set recorded", applied)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("inbox rows after the upgrade: %d, %v", n, err)
	}
}
