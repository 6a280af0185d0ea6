package fakegateway

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// The gateway's schema applies once; applied again, it finds nothing to do.
func TestMigrationsApplyTwice(t *testing.T) {
	db, err := sql.Open("pgx", kittest.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	first, err := migrations.Apply(ctx, db, Migrations)
	if err != nil || len(first[Migrations.Name()]) == 0 {
		t.Fatalf("first apply: %v %v", first, err)
	}
	second, err := migrations.Apply(ctx, db, Migrations)
	if err != nil || len(second[Migrations.Name()]) != 0 {
		t.Fatalf("second apply: applied %v, err %v; want nothing, no error", second, err)
	}
}
