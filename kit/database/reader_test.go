package database_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// A Reader reads, and PostgreSQL refuses every write made through it, on a
// pool of its own (OpenReader) as in a transaction on the caller's
// (NewReader).
func TestReaderRefusesWrites(t *testing.T) {
	db, url := testenv.MigratedDB(t)
	own, err := database.OpenReader(context.Background(), database.Options{URL: url, MaxConns: 2}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	for name, r := range map[string]database.Reader{"OpenReader": own, "NewReader": database.NewReader(db)} {
		t.Run(name, func(t *testing.T) { refusesWrites(t, db, r) })
	}
	if err := (database.Reader{}).Read(context.Background(), func(*gorm.DB) error { return nil }); err == nil {
		t.Error("a zero Reader read")
	}
}

func refusesWrites(t *testing.T, db *gorm.DB, r database.Reader) {
	if err := db.Exec(`CREATE TABLE IF NOT EXISTS things (id int PRIMARY KEY)`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`INSERT INTO things VALUES (1) ON CONFLICT DO NOTHING`).Error; err != nil {
		t.Fatal(err)
	}
	var n int
	if err := r.Read(context.Background(), func(tx *gorm.DB) error { return tx.Raw(`SELECT count(*) FROM things`).Scan(&n).Error }); err != nil || n != 1 {
		t.Fatalf("read: %d rows, %v", n, err)
	}
	for _, write := range []string{`INSERT INTO things VALUES (2)`, `UPDATE things SET id = 3`, `DELETE FROM things`} {
		err := r.Read(context.Background(), func(tx *gorm.DB) error { return tx.Exec(write).Error })
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "25006" {
			t.Errorf("%s through a Reader: %v, want SQLSTATE 25006 (read-only transaction)", write, err)
		}
	}
	if err := db.Raw(`SELECT count(*) FROM things WHERE id = 1`).Scan(&n).Error; err != nil || n != 1 {
		t.Errorf("after the refused writes: %d rows with id 1 (%v), want 1", n, err)
	}
}
