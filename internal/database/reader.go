package database

import (
	"context"
	"database/sql"
	"errors"

	"gorm.io/gorm"
)

// Reader is what a handler may do with the database outside its writes:
// read, in read-only transactions on the service's pool. A handler is never
// handed the pool itself, so that nothing it does can write outside the
// inbox transaction, where a write would commit whatever became of the
// message.
type Reader struct{ db *gorm.DB }

// NewReader returns a Reader on db.
func NewReader(db *gorm.DB) Reader { return Reader{db: db} }

// Read runs f in a read-only transaction (BEGIN READ ONLY: PostgreSQL
// refuses any write in it, SQLSTATE 25006) and commits it.
func (r Reader) Read(ctx context.Context, f func(tx *gorm.DB) error) error {
	if r.db == nil {
		return errors.New("database.Reader: no database (a zero Reader)")
	}
	return r.db.WithContext(ctx).Transaction(f, &sql.TxOptions{ReadOnly: true})
}
