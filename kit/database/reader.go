package database

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"

	"gorm.io/gorm"
)

// Reader is what a handler may do with the database outside its writes:
// read. A handler is never handed the service's pool, so that nothing it
// does can write outside the inbox transaction, where a write would commit
// whatever became of the message. PostgreSQL itself refuses every write
// made through a Reader (SQLSTATE 25006): a guard against mistakes, not
// against a handler set on writing (it could SET its session back, and the
// SET would stay on that pooled session for every later read).
type Reader struct {
	db *gorm.DB
	// session: db is a pool of its own whose sessions are read only
	// (OpenReader), so a read needs no transaction of its own.
	session bool
}

// OpenReader opens a pool of o.MaxConns read-only sessions
// (default_transaction_read_only): each read runs as is, one round trip per
// statement, where a read-only transaction on a shared pool costs a BEGIN
// and a COMMIT more. Close it with Close.
func OpenReader(ctx context.Context, o Options, log *slog.Logger) (Reader, error) {
	o.ReadOnly = true
	db, err := Open(ctx, o, log)
	if err != nil {
		return Reader{}, err
	}
	return Reader{db: db, session: true}, nil
}

// NewReader returns a Reader on a pool the caller keeps: each read is a
// read-only transaction of its own (BEGIN READ ONLY … COMMIT).
func NewReader(db *gorm.DB) Reader { return Reader{db: db} }

// Read runs f. On a Reader of OpenReader, each statement of f is a
// read-only transaction of its own; a read that needs one snapshot across
// several statements opens a transaction in f (tx.Transaction). On a
// Reader of NewReader, f runs in one read-only transaction, committed.
func (r Reader) Read(ctx context.Context, f func(tx *gorm.DB) error) error {
	switch {
	case r.db == nil:
		return errors.New("database.Reader: no database (a zero Reader)")
	case r.session:
		return f(r.db.WithContext(ctx))
	}
	return r.db.WithContext(ctx).Transaction(f, &sql.TxOptions{ReadOnly: true})
}

// Close closes the pool of a Reader of OpenReader; it does nothing for one
// of NewReader, whose pool is the caller's.
func (r Reader) Close() error {
	if !r.session || r.db == nil {
		return nil
	}
	return Close(r.db)
}

// Recycle closes the idle sessions of a Reader of OpenReader (see Recycle).
func (r Reader) Recycle() {
	if r.session && r.db != nil {
		Recycle(r.db)
	}
}
