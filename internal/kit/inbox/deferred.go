package inbox

import (
	"context"

	"gorm.io/gorm"
)

// A Deferred collects writes of several items of one batch that cost less
// done together: the outbox's inserts, one statement for the whole batch
// instead of one per message. Flush runs them, in the batch's transaction,
// after every item's Apply and before COMMIT.
type Deferred interface {
	Flush(tx *gorm.DB) error
}

// Defer returns the Deferred of tx's batch under key, made by make on first
// use, and true; or false if tx is not the very *gorm.DB an item's Apply was
// given in the optimistic transaction of a batch (a single item, the
// savepoint pass, a transaction of the caller's own, a nested tx.Transaction
// whose savepoint may roll back, a tx.WithContext or Session): then the caller
// writes at once. A Flush that fails
// rolls the optimistic transaction back, and the batch runs again with a
// savepoint per item, where nothing is deferred: the failure is found again
// and stays with its item.
func Defer[D Deferred](tx *gorm.DB, key any, make func() D) (D, bool) {
	var zero D
	b, ok := tx.Statement.Context.Value(batchKey{}).(*batch)
	if !ok || b.tx != tx {
		return zero, false
	}
	for i, k := range b.keys {
		if k == key {
			d, ok := b.deferred[i].(D)
			return d, ok
		}
	}
	d := make()
	b.keys = append(b.keys, key)
	b.deferred = append(b.deferred, d)
	return d, true
}

type batchKey struct{}

// batch is what an optimistic transaction's items deferred, in the order of
// their first use.
type batch struct {
	tx       *gorm.DB // the transaction's, as given to each Apply
	keys     []any
	deferred []Deferred
}

func withBatch(ctx context.Context, b *batch) context.Context {
	return context.WithValue(ctx, batchKey{}, b)
}

func (b *batch) flush(tx *gorm.DB) error {
	for _, d := range b.deferred {
		if err := d.Flush(tx); err != nil {
			return err
		}
	}
	return nil
}
