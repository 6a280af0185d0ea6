package migrations_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/inbox-template/payment-service/internal/migrations"
	"github.com/inbox-template/payment-service/internal/testenv"
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
	for _, set := range []migrations.Set{migrations.Payments, migrations.Gateway} {
		db := open(t, testenv.Postgres(t))
		ctx := context.Background()
		first, err := migrations.Apply(ctx, db, set)
		if err != nil || len(first) == 0 {
			t.Fatalf("first apply: %v %v", first, err)
		}
		second, err := migrations.Apply(ctx, db, set)
		if err != nil || len(second) != 0 {
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
		wg.Go(func() { applied[i], errs[i] = migrations.Apply(ctx, db, migrations.Payments) })
	}
	wg.Wait()
	total := 0
	for i := range replicas {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	version, err := migrations.Version(ctx, open(t, url), migrations.Payments)
	if err != nil {
		t.Fatal(err)
	}
	if total != int(version) {
		t.Fatalf("%d migrations applied in all, schema version %d: some ran twice or not at all", total, version)
	}
}
