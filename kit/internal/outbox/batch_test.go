package outbox

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// countInserts counts the outbox insert statements db runs.
func countInserts(t *testing.T, db *gorm.DB) *atomic.Int32 {
	var n atomic.Int32
	err := db.Callback().Raw().After("gorm:raw").Register("test:count_outbox_inserts", func(tx *gorm.DB) {
		if strings.Contains(tx.Statement.SQL.String(), "INSERT INTO outbox (") {
			n.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return &n
}

// groupCommit commits one inbox batch whose items m1…mN each enqueue the
// message their msg gives, on the very tx their writes get.
func groupCommit(t *testing.T, ib *inbox.Inbox, ob *Outbox, msgs []Message) []inbox.Result {
	t.Helper()
	items := make([]inbox.Item, len(msgs))
	for i, m := range msgs {
		items[i] = inbox.Item{MessageID: fmt.Sprintf("m%d", i+1), Body: m.Body, Apply: func(tx *gorm.DB) error {
			_, err := ob.Enqueue(context.Background(), tx, m)
			return err
		}}
	}
	results, err := ib.Commit(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	return results
}

// TestAGroupCommitInsertsItsOutboxRowsWithOneStatement: the messages that the
// items of one group commit enqueue are inserted by one statement before its
// COMMIT, each ordering key numbered in the items' order, only each key's
// head due now.
func TestAGroupCommitInsertsItsOutboxRowsWithOneStatement(t *testing.T) {
	db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Outbox)
	ob, ib := New("producer"), inbox.New(db, "test")
	inserts := countInserts(t, db)
	keys := []string{"a", "b", "a", "b", "a", ""}
	msgs := make([]Message, len(keys))
	for i, k := range keys {
		msgs[i] = event(i+1, k)
	}
	for i, r := range groupCommit(t, ib, ob, msgs) {
		if r.Err != nil || !r.Fresh {
			t.Fatalf("item %d: %+v", i+1, r)
		}
	}
	if n := inserts.Load(); n != 1 {
		t.Fatalf("%d outbox insert statements for one group commit, want 1", n)
	}
	type row struct {
		Body        string
		OrderingKey *string
		Seq         *int64
		Due         bool
	}
	var rows []row
	if err := db.Raw(`SELECT convert_from(body, 'UTF8') AS body, ordering_key, seq, available_at <= now() AS due
		FROM outbox ORDER BY ordering_key NULLS LAST, seq`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		k, seq := "-", int64(0)
		if r.OrderingKey != nil {
			k, seq = *r.OrderingKey, *r.Seq
		}
		got = append(got, fmt.Sprintf("%s#%d %s due=%v", k, seq, r.Body, r.Due))
	}
	want := []string{
		`a#1 {"n":1,"key":"a"} due=true`, `a#2 {"n":3,"key":"a"} due=false`, `a#3 {"n":5,"key":"a"} due=false`,
		`b#1 {"n":2,"key":"b"} due=true`, `b#2 {"n":4,"key":"b"} due=false`,
		`-#0 {"n":6,"key":""} due=true`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("outbox rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestADeferredInsertThatFailsStaysWithItsMessage: when the batch's one
// insert fails, the batch runs again with a savepoint per item, inserting at
// once: the item whose row the database refuses fails alone, with the
// database's error, and the others commit with their rows.
func TestADeferredInsertThatFailsStaysWithItsMessage(t *testing.T) {
	db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Outbox)
	if err := db.Exec(`ALTER TABLE outbox ADD CONSTRAINT test_no_poison CHECK (body <> convert_to('poison', 'UTF8'))`).Error; err != nil {
		t.Fatal(err)
	}
	ob, ib := New("producer"), inbox.New(db, "test")
	inserts := countInserts(t, db)
	msgs := []Message{event(1, "a"), {Exchange: exchange, RoutingKey: key, Body: []byte("poison"), OrderingKey: "a"}, event(3, "a")}
	results := groupCommit(t, ib, ob, msgs)
	if results[1].Err == nil || !strings.Contains(results[1].Err.Error(), "test_no_poison") {
		t.Fatalf("the refused item: %+v, want the check constraint's error", results[1])
	}
	for _, i := range []int{0, 2} {
		if results[i].Err != nil || !results[i].Fresh {
			t.Fatalf("item %d: %+v, want committed", i+1, results[i])
		}
	}
	// The failed batch statement, then one insert per item with a savepoint.
	if n := inserts.Load(); n != 4 {
		t.Fatalf("%d outbox insert statements, want 1 for the batch and 3 in the savepoint pass", n)
	}
	var bodies []string
	if err := db.Raw(`SELECT convert_from(body, 'UTF8') FROM outbox ORDER BY seq`).Scan(&bodies).Error; err != nil {
		t.Fatal(err)
	}
	if want := []string{`{"n":1,"key":"a"}`, `{"n":3,"key":"a"}`}; fmt.Sprint(bodies) != fmt.Sprint(want) {
		t.Fatalf("outbox bodies %v, want %v", bodies, want)
	}
	var claimed int64
	if err := db.Table("inbox").Where("message_id = 'm2'").Count(&claimed).Error; err != nil || claimed != 0 {
		t.Fatalf("the refused item's inbox row: %d (%v), want none", claimed, err)
	}
}

// TestEnqueueInsertsAtOnceOutsideTheBatchsOwnTx: on a tx the writes derived
// (a nested transaction whose savepoint may roll back, WithContext), or a
// batch of one, nothing is deferred.
func TestEnqueueInsertsAtOnceOutsideTheBatchsOwnTx(t *testing.T) {
	db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Outbox)
	ob, ib := New("producer"), inbox.New(db, "test")
	inserts := countInserts(t, db)
	items := []inbox.Item{
		{MessageID: "nested", Body: []byte("1"), Apply: func(tx *gorm.DB) error {
			// The nested transaction rolls back: its message must go with it.
			_ = tx.Transaction(func(tx *gorm.DB) error {
				if _, err := ob.Enqueue(context.Background(), tx, event(1, "a")); err != nil {
					return err
				}
				return fmt.Errorf("changed my mind")
			})
			return nil
		}},
		{MessageID: "derived", Body: []byte("2"), Apply: func(tx *gorm.DB) error {
			_, err := ob.Enqueue(context.Background(), tx.WithContext(context.Background()), event(2, "a"))
			return err
		}},
	}
	if _, err := ib.Commit(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	if n := inserts.Load(); n != 2 {
		t.Fatalf("%d outbox insert statements, want one at each call", n)
	}
	var bodies []string
	if err := db.Raw(`SELECT convert_from(body, 'UTF8') FROM outbox`).Scan(&bodies).Error; err != nil {
		t.Fatal(err)
	}
	if want := []string{`{"n":2,"key":"a"}`}; fmt.Sprint(bodies) != fmt.Sprint(want) {
		t.Fatalf("outbox bodies %v, want only the derived tx's (the nested one rolled back)", bodies)
	}
	groupCommit(t, ib, ob, []Message{event(3, "")}) // a batch of one
	if n := inserts.Load(); n != 3 {
		t.Fatalf("%d outbox insert statements after a batch of one, want 3", n)
	}
}

// outboxOrder is the outbox's rows as key#seq body, in key and sequence order.
func outboxOrder(t *testing.T, db *gorm.DB) string {
	t.Helper()
	var rows []string
	if err := db.Raw(`SELECT coalesce(ordering_key, '-') || '#' || coalesce(seq, 0) || ' ' || convert_from(body, 'UTF8')
		FROM outbox ORDER BY ordering_key NULLS LAST, seq`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	return strings.Join(rows, " | ")
}

// TestARollbackToASavepointUndoesTheMessagesEnqueuedAfterIt: a deferred
// message is not yet in the database, so a savepoint first writes what the
// batch deferred and ends deferring: a rollback to it then undoes the
// messages enqueued after it, as it would without group commit. (An outside
// review found the rolled-back message committed.)
func TestARollbackToASavepointUndoesTheMessagesEnqueuedAfterIt(t *testing.T) {
	db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Outbox)
	ob, ib := New("producer"), inbox.New(db, "test")
	ctx := context.Background()
	items := []inbox.Item{
		{MessageID: "m1", Body: []byte("1"), Apply: func(tx *gorm.DB) error {
			if _, err := ob.Enqueue(ctx, tx, event(1, "a")); err != nil { // deferred, then written at the savepoint
				return err
			}
			if err := tx.SavePoint("attempt").Error; err != nil {
				return err
			}
			if _, err := ob.Enqueue(ctx, tx, event(2, "a")); err != nil {
				return err
			}
			return tx.RollbackTo("attempt").Error
		}},
		{MessageID: "m2", Body: []byte("2"), Apply: func(tx *gorm.DB) error {
			_, err := ob.Enqueue(ctx, tx, event(3, "b"))
			return err
		}},
	}
	results, err := ib.Commit(ctx, items)
	if err != nil || results[0].Err != nil || results[1].Err != nil {
		t.Fatalf("commit: %v %+v", err, results)
	}
	if got, want := outboxOrder(t, db), `a#1 {"n":1,"key":"a"} | b#1 {"n":3,"key":"b"}`; got != want {
		t.Fatalf("outbox: %s\nwant:   %s (the message enqueued after the savepoint rolled back)", got, want)
	}
}

// TestDeferredAndImmediateEnqueuesKeepTheOrderOfTheCalls: a call on a tx the
// writes derived inserts at once, after what the batch deferred before it,
// so one key's messages are numbered in the order of the calls. (An outside
// review found them inverted.)
func TestDeferredAndImmediateEnqueuesKeepTheOrderOfTheCalls(t *testing.T) {
	db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Outbox)
	ob, ib := New("producer"), inbox.New(db, "test")
	ctx := context.Background()
	items := []inbox.Item{
		{MessageID: "m1", Body: []byte("1"), Apply: func(tx *gorm.DB) error {
			_, err := ob.Enqueue(ctx, tx, event(1, "k"))
			return err
		}},
		{MessageID: "m2", Body: []byte("2"), Apply: func(tx *gorm.DB) error {
			_, err := ob.Enqueue(ctx, tx.WithContext(ctx), event(2, "k"))
			return err
		}},
		{MessageID: "m3", Body: []byte("3"), Apply: func(tx *gorm.DB) error {
			_, err := ob.Enqueue(ctx, tx, event(3, "k")) // deferring ended: at once
			return err
		}},
	}
	results, err := ib.Commit(ctx, items)
	if err != nil || results[0].Err != nil || results[1].Err != nil || results[2].Err != nil {
		t.Fatalf("commit: %v %+v", err, results)
	}
	want := `k#1 {"n":1,"key":"k"} | k#2 {"n":2,"key":"k"} | k#3 {"n":3,"key":"k"}`
	if got := outboxOrder(t, db); got != want {
		t.Fatalf("outbox: %s\nwant:   %s", got, want)
	}
}
