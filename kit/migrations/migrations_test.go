package migrations_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"testing/fstest"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// notes stands for a service's own schema: the kit's tests use no service's.
var notes = migrations.NewSet("notes", fstest.MapFS{
	"00001_notes.sql": {Data: []byte("-- +goose Up\nCREATE TABLE notes (id bigint PRIMARY KEY, body text NOT NULL);\n-- +goose Down\nDROP TABLE notes;\n")},
})

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
	for _, set := range []migrations.Set{migrations.Inbox, migrations.Buffered, migrations.Outbox, notes} {
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
	if _, err := migrations.Apply(ctx, db, migrations.Inbox, notes); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"inbox_schema_version", "notes_schema_version"} {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" WHERE version_id > 0").Scan(&n); err != nil || n != 1 {
			t.Errorf("%s: %d versions, %v; want 1", table, n, err)
		}
	}
}

// A database migrated before the buffered inbox existed (the inbox and a
// service's schema) takes the buffered set as a set of its own, and keeps
// its rows.
func TestBufferedSetJoinsAnExistingDatabase(t *testing.T) {
	db := open(t, testenv.Postgres(t))
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, db, migrations.Inbox, notes); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO inbox VALUES ('m1', 'payment-service', sha256('x'), now())`); err != nil {
		t.Fatal(err)
	}
	applied, err := migrations.Apply(ctx, db, migrations.Inbox, migrations.Buffered, notes)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if len(applied["inbox"]) != 0 || len(applied["notes"]) != 0 || len(applied["buffered"]) == 0 {
		t.Fatalf("applied %v, want the buffered set's versions only", applied)
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
