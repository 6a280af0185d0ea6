// Package migrations applies versioned SQL schemas, embedded in the binaries,
// under a PostgreSQL advisory lock so that replicas starting together never
// race. Every schema is a Set with its own version table: the kit's inbox
// (Inbox, Buffered for the buffered inbox, Outbox) here, and each service's own
// set in its own package (payment.Migrations, fakegateway.Migrations). A
// service's database holds the inbox sets and the service's set side by side.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

//go:embed inbox/*.sql buffered/*.sql outbox/*.sql
var files embed.FS

// Set is one schema: numbered goose SQL files (00001_name.sql, …) applied in
// order and recorded in a version table of its own, <name>_schema_version.
type Set struct {
	name string
	fsys fs.FS
}

// NewSet returns the schema called name whose SQL files are at the root of
// fsys, for example an embed.FS narrowed with fs.Sub. The name keys the
// version table and the advisory lock: keep it stable once deployed.
func NewSet(name string, fsys fs.FS) Set { return Set{name: name, fsys: fsys} }

// Must narrows an embedded tree to one directory for NewSet; it panics on a
// path that cannot exist, a programming error caught by any test.
func Must(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

var (
	// Inbox is the kit's own schema: the inbox table every consumer shares.
	Inbox = NewSet("inbox", Must(files, "inbox"))
	// Buffered is the kit's schema of the buffered inbox (INBOX_MODE=buffered):
	// the stored messages and their ordering keys. It is applied with Inbox in
	// every mode, so that a service can switch modes without a migration.
	Buffered = NewSet("buffered", Must(files, "buffered"))
	// Outbox is the kit's schema of the transactional outbox: the messages a
	// handler emits, written in its inbox transaction, and their ordering keys.
	Outbox = NewSet("outbox", Must(files, "outbox"))
)

// Name is the set's name.
func (s Set) Name() string { return s.name }

// Table is the set's goose version table: the name with every character that
// an unquoted SQL identifier cannot hold turned into _ ("notification-service"
// gives notification_service_schema_version).
func (s Set) Table() string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, s.name) + "_schema_version"
}

func (s Set) lockID() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("migrations:" + s.name))
	return int64(h.Sum64() >> 1)
}

// Apply brings db up to the newest version of each set, in order, and returns
// the versions it applied per set name. Concurrent callers queue on a session
// advisory lock per set; the second finds nothing left to do.
func Apply(ctx context.Context, db *sql.DB, sets ...Set) (map[string][]int64, error) {
	applied := map[string][]int64{}
	for _, set := range sets {
		p, err := provider(db, set)
		if err != nil {
			return applied, err
		}
		results, err := p.Up(ctx)
		if err != nil {
			return applied, fmt.Errorf("migrate %s: %w", set.name, err)
		}
		for _, r := range results {
			applied[set.name] = append(applied[set.name], r.Source.Version)
		}
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
	// Poll the advisory lock every second for up to five minutes.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(set.lockID()), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	store, err := database.NewStore(database.DialectPostgres, set.Table())
	if err != nil {
		return nil, fmt.Errorf("migrations %s: %w", set.name, err)
	}
	p, err := goose.NewProvider("", db, set.fsys, goose.WithStore(store), goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations %s: %w", set.name, err)
	}
	return p, nil
}
