// Package migrations holds the versioned SQL schemas of the payments and the
// gateway databases, embedded in the binaries, and applies them under a
// PostgreSQL advisory lock so that replicas starting together never race.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed payments/*.sql gateway/*.sql
var files embed.FS

// Set is one database's migrations.
type Set struct {
	name   string
	lockID int64
}

var (
	// Payments is the schema of the payment service: inbox and payments.
	Payments = Set{name: "payments", lockID: 0x7061796d656e7473}
	// Gateway is the schema of the fake payment gateway: charges.
	Gateway = Set{name: "gateway", lockID: 0x67617465776179}
)

// Apply brings db up to the newest version of set and returns the versions it
// applied. Concurrent callers queue on a session advisory lock; the second finds
// nothing left to do.
func Apply(ctx context.Context, db *sql.DB, set Set) ([]int64, error) {
	p, err := provider(db, set)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", set.name, err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// Version reports the newest applied version of set in db.
func Version(ctx context.Context, db *sql.DB, set Set) (int64, error) {
	p, err := provider(db, set)
	if err != nil {
		return 0, err
	}
	return p.GetDBVersion(ctx)
}

func provider(db *sql.DB, set Set) (*goose.Provider, error) {
	sub, err := fs.Sub(files, set.name)
	if err != nil {
		return nil, fmt.Errorf("migrations %s: %w", set.name, err)
	}
	// Poll the advisory lock every second for up to five minutes.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(set.lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations %s: %w", set.name, err)
	}
	return p, nil
}
