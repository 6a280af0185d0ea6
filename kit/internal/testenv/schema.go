package testenv

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// MigratedDB returns a GORM handle on a fresh database with the sets applied.
func MigratedDB(t testing.TB, sets ...migrations.Set) (*gorm.DB, string) {
	t.Helper()
	url := Postgres(t)
	ctx := context.Background()
	db, err := database.Open(ctx, database.Options{URL: url, MaxConns: 20, StatementTimeout: 10 * time.Second, AppName: "test"}, Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, sqlDB, sets...); err != nil {
		t.Fatal(err)
	}
	return db, url
}

// AssertModelMatchesTable fails unless model's GORM fields and the migrated
// table have the same columns with the same nullability.
func AssertModelMatchesTable(t testing.TB, db *gorm.DB, model any) {
	t.Helper()
	s, err := schema.Parse(model, &schemaCache, db.NamingStrategy)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := db.Migrator().ColumnTypes(model)
	if err != nil {
		t.Fatal(err)
	}
	var tableCols []string
	for _, c := range cols {
		tableCols = append(tableCols, c.Name())
		f := s.LookUpField(c.Name())
		if f == nil {
			continue
		}
		nullable, _ := c.Nullable()
		if modelNullable := !f.NotNull && !f.PrimaryKey; nullable != modelNullable {
			t.Errorf("%s.%s: table nullable=%v, model nullable=%v", s.Table, c.Name(), nullable, modelNullable)
		}
	}
	modelCols := slices.Clone(s.DBNames)
	slices.Sort(tableCols)
	slices.Sort(modelCols)
	if !slices.Equal(tableCols, modelCols) {
		t.Errorf("%s: table columns %v, model columns %v", s.Table, tableCols, modelCols)
	}
}

var schemaCache sync.Map
