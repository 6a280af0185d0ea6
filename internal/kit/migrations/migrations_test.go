package migrations_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/inbox-template/payment-service/internal/demo/fakegateway"
	"github.com/inbox-template/payment-service/internal/kit/migrations"
	"github.com/inbox-template/payment-service/internal/kit/testenv"
	"github.com/inbox-template/payment-service/internal/payment"
)

func open(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestApplyTwice(t *testing.T) {
	for _, set := range []migrations.Set{migrations.Inbox, migrations.Buffered, payment.Migrations, fakegateway.Migrations} {
		db := open(t, testenv.Postgres(t))
		ctx := context.Background()
		first, err := migrations.Apply(ctx, db, set)
		if err != nil || len(first[set.Name()]) == 0 {
			t.Fatalf("first apply: %v %v", first, err)
		}
		second, err := migrations.Apply(ctx, db, set)
		if err != nil || len(second[set.Name()]) != 0 {
			t.Fatalf("second apply: applied %v, err %v; want nothing, no error", second, err)
		}
	}
}

// Replicas starting together each open their own connection pool: the advisory
// lock makes one apply the migrations and the others find nothing to do.
func TestApplyConcurrently(t *testing.T) {
	url := testenv.Postgres(t)
	ctx := context.Background()
	const replicas = 4
	applied := make([][]int64, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		db := open(t, url)
		wg.Go(func() {
			var got map[string][]int64
			got, errs[i] = migrations.Apply(ctx, db, migrations.Inbox)
			applied[i] = got["inbox"]
		})
	}
	wg.Wait()
	total := 0
	for i := range replicas {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	version, err := migrations.Version(ctx, open(t, url), migrations.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	if total != int(version) {
		t.Fatalf("%d migrations applied in all, schema version %d: some ran twice or not at all", total, version)
	}
}

// Two schemas in one database keep their versions apart: the inbox's and a
// service's own each have a version table.
func TestSetsHaveTheirOwnVersions(t *testing.T) {
	db := open(t, testenv.Postgres(t))
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, db, migrations.Inbox, payment.Migrations); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"inbox_schema_version", "payments_schema_version"} {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" WHERE version_id > 0").Scan(&n); err != nil || n != 1 {
			t.Errorf("%s: %d versions, %v; want 1", table, n, err)
		}
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
	db := open(t, testenv.Postgres(t))
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

// A database migrated before the buffered inbox existed (the inbox and a
// service's schema) takes the buffered set as a set of its own, and keeps
// its rows.
func TestBufferedSetJoinsAnExistingDatabase(t *testing.T) {
	db := open(t, testenv.Postgres(t))
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, db, migrations.Inbox, payment.Migrations); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO inbox VALUES ('m1', 'payment-service', sha256('x'), now())`); err != nil {
		t.Fatal(err)
	}
	applied, err := migrations.Apply(ctx, db, migrations.Inbox, migrations.Buffered, payment.Migrations)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if len(applied["inbox"]) != 0 || len(applied["payments"]) != 0 || len(applied["buffered"]) != 1 {
		t.Fatalf("applied %v, want the buffered set's version 1 only", applied)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM inbox) + (SELECT count(*) FROM inbox_messages)`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after the upgrade: %d, %v", n, err)
	}
}

// A set named like a service ("notification-service") gets a version table
// whose name PostgreSQL takes unquoted.
func TestSetNamedLikeAService(t *testing.T) {
	set := migrations.NewSet("Notification-Service", fstest.MapFS{
		"00001_notes.sql": {Data: []byte("-- +goose Up\nCREATE TABLE notes (id int);\n-- +goose Down\nDROP TABLE notes;\n")},
	})
	if got := set.Table(); got != "notification_service_schema_version" {
		t.Fatalf("table %q", got)
	}
	db := open(t, testenv.Postgres(t))
	if _, err := migrations.Apply(context.Background(), db, set); err != nil {
		t.Fatal(err)
	}
}
