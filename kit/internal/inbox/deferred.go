package inbox

import (
	"strings"
	"sync"

	"gorm.io/gorm"
)

// A Deferred collects writes of several items of one batch that cost less
// done together: the outbox's inserts, one statement for the whole batch
// instead of one per message. Flush runs them, in the batch's transaction,
// after every item's Apply and before COMMIT, or earlier if the items'
// writes do something that the deferred writes must come before (see Defer).
type Deferred interface {
	Flush(tx *gorm.DB) error
}

// Defer returns the Deferred of tx's batch under key, made by make on first
// use, and true, when tx is the very *gorm.DB an item's Apply was given in
// the optimistic transaction of a batch. Otherwise it returns false, and the
// caller writes at once: outside a batch (a single item, the savepoint pass,
// a transaction of the caller's own), and on a tx the writes derived from
// theirs (tx.WithContext, tx.Session, a nested tx.Transaction). In the last
// case what the batch deferred so far is written first, so that the writes
// keep the order of the calls.
//
// A savepoint ends deferring for the rest of the transaction: what was
// deferred is written before the SAVEPOINT (or ROLLBACK TO) statement runs,
// and later calls write at once, so that a rollback to it undoes what was
// written after it. A Flush that fails rolls the optimistic transaction back,
// and the batch runs again with a savepoint per item, where nothing is
// deferred: the failure is found again and stays with its item.
//
// Deferred rows are not in the database until the flush: writes that read
// back what they deferred must use a tx of their own making (tx.Session)
// for the call.
func Defer[D Deferred](tx *gorm.DB, key any, make func() D) (D, bool) {
	var zero D
	b := batchOf(tx)
	switch {
	case b == nil || b.off:
		return zero, false
	case b.tx != tx:
		if err := b.stop(tx); err != nil {
			_ = tx.AddError(err)
		}
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

// batches maps the database/sql transaction of each optimistic pass running
// now to its batch.
var batches sync.Map // gorm.ConnPool → *batch

func batchOf(tx *gorm.DB) *batch {
	if tx == nil || tx.Statement == nil || tx.Statement.ConnPool == nil {
		return nil
	}
	b, _ := batches.Load(tx.Statement.ConnPool)
	bt, _ := b.(*batch)
	return bt
}

// batch is what an optimistic transaction's items deferred, in the order of
// their first use.
type batch struct {
	tx       *gorm.DB // the transaction's, as given to each Apply
	keys     []any
	deferred []Deferred
	off      bool // deferring ended: everything is written at once
}

// begin registers the batch of the optimistic transaction tx; end undoes it.
func (b *batch) begin(tx *gorm.DB) {
	b.tx = tx
	batches.Store(tx.Statement.ConnPool, b)
}

func (b *batch) end() { batches.Delete(b.tx.Statement.ConnPool) }

// stop writes what was deferred and ends deferring.
func (b *batch) stop(tx *gorm.DB) error {
	if b.off {
		return nil
	}
	b.off = true
	return b.flush(tx.Session(&gorm.Session{NewDB: true}))
}

func (b *batch) flush(tx *gorm.DB) error {
	for _, d := range b.deferred {
		if err := d.Flush(tx); err != nil {
			return err
		}
	}
	b.deferred, b.keys = nil, nil
	return nil
}

// registerSavepointFlush makes every SAVEPOINT and ROLLBACK TO statement run
// on db (gorm's SavePoint and RollbackTo, a nested Transaction, a raw Exec)
// first write what its batch deferred (batch.stop). Once per gorm config.
func registerSavepointFlush(db *gorm.DB) {
	if _, loaded := registered.LoadOrStore(db.Config, true); loaded {
		return
	}
	_ = db.Callback().Raw().Before("gorm:raw").Register("inbox:flush_before_savepoint", func(tx *gorm.DB) {
		b := batchOf(tx)
		if b == nil || b.off || tx.Error != nil {
			return
		}
		sql := strings.ToUpper(strings.TrimSpace(tx.Statement.SQL.String()))
		if strings.HasPrefix(sql, "SAVEPOINT") || strings.HasPrefix(sql, "ROLLBACK TO") {
			if err := b.stop(tx); err != nil {
				_ = tx.AddError(err)
			}
		}
	})
}

var registered sync.Map // *gorm.Config → true
