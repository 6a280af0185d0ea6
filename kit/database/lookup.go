package database

import (
	"context"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"
)

// Lookup gathers the concurrent reads of one kind, one key each, into one
// statement: a handler's read before its outside call (is this order paid
// already?) costs one round trip per message on its own, and a service runs
// many handlers at once. Get adds a key and waits; while a statement is in
// flight the keys asked meanwhile wait for the next, so nothing waits for a
// batch to fill: alone, a read runs at once, as one.
//
//	paid := database.NewLookup(k.Reader, 64, func(ctx context.Context, tx *gorm.DB, ids []string) (map[string]Payment, error) {
//		var rows []Payment
//		err := tx.Raw(`SELECT … FROM payments WHERE order_id IN ?`, ids).Scan(&rows).Error
//		…
//	})
//	p, found, err := paid.Get(ctx, ev.OrderID)
//
// read returns the rows found, by key; a key it leaves out is not found. An
// error (or a panic) of a statement fails every key it read: keep the keys
// valid (a Decoder validates them) so that one message cannot fail others. Its
// statement runs on the Reader with a context of its own (the first caller's
// values, none of its cancellation, LookupTimeout): one caller giving up must
// not fail the others' reads.
type Lookup[K comparable, V any] struct {
	reader  Reader
	max     int
	read    func(ctx context.Context, tx *gorm.DB, keys []K) (map[K]V, error)
	mu      sync.Mutex
	pending []*lookupCall[K, V]
	running bool
}

// LookupTimeout bounds one statement of a Lookup.
const LookupTimeout = 10 * time.Second

type lookupCall[K comparable, V any] struct {
	ctx   context.Context
	key   K
	v     V
	found bool
	err   error
	done  chan struct{}
}

// NewLookup returns a Lookup whose statements read at most maxKeys keys (1
// reads one key per statement) through r. One statement is in flight at a
// time.
func NewLookup[K comparable, V any](r Reader, maxKeys int, read func(ctx context.Context, tx *gorm.DB, keys []K) (map[K]V, error)) *Lookup[K, V] {
	return &Lookup[K, V]{reader: r, max: max(maxKeys, 1), read: read}
}

// Get reads key, with the keys other callers asked for meanwhile.
func (l *Lookup[K, V]) Get(ctx context.Context, key K) (v V, found bool, err error) {
	c := &lookupCall[K, V]{ctx: ctx, key: key, done: make(chan struct{})}
	l.mu.Lock()
	l.pending = append(l.pending, c)
	serve := !l.running
	l.running = true
	l.mu.Unlock()
	if serve {
		go l.serve() // its own key is in the batch; it may give up waiting
	}
	select {
	case <-c.done:
		return c.v, c.found, c.err
	case <-ctx.Done():
		return v, false, ctx.Err()
	}
}

// serve reads batches of the pending keys until none is pending.
func (l *Lookup[K, V]) serve() {
	for {
		l.mu.Lock()
		if len(l.pending) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		n := min(len(l.pending), l.max)
		batch := l.pending[:n:n]
		l.pending = l.pending[n:]
		l.mu.Unlock()
		l.readBatch(batch)
	}
}

func (l *Lookup[K, V]) readBatch(batch []*lookupCall[K, V]) {
	keys := make([]K, 0, len(batch))
	seen := make(map[K]bool, len(batch))
	for _, c := range batch {
		if !seen[c.key] {
			seen[c.key] = true
			keys = append(keys, c.key)
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), LookupTimeout)
	defer cancel()
	var found map[K]V
	err := l.reader.Read(ctx, func(tx *gorm.DB) (err error) {
		defer func() {
			if v := recover(); v != nil { // a caller's read function: it must not kill the process
				err = fmt.Errorf("the read panicked: %v", v)
			}
		}()
		found, err = l.read(ctx, tx, keys)
		return err
	})
	if err != nil {
		err = fmt.Errorf("look up %d keys: %w", len(keys), err)
	}
	for _, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.v, c.found = found[c.key]
		}
		close(c.done)
	}
}
