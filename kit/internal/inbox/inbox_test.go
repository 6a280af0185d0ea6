package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// setup returns a migrated database with an extra effects table that stands
// for a handler's business writes.
func setup(t *testing.T) *gorm.DB {
	t.Helper()
	db, _ := testenv.MigratedDB(t, migrations.Inbox)
	if err := db.Exec(`CREATE TABLE effects (message_id text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	return db
}

func writeEffect(id string) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		return tx.Exec(`INSERT INTO effects (message_id) VALUES (?)`, id).Error
	}
}

func count(t *testing.T, db *gorm.DB, table, id string) int64 {
	t.Helper()
	var n int64
	if err := db.Table(table).Where("message_id = ?", id).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func TestModelMatchesSchema(t *testing.T) {
	db := setup(t)
	testenv.AssertModelMatchesTable(t, db, &inbox.Entry{})
}

func TestProcess(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	ib := inbox.New(db, "payments")
	errBoom := errors.New("boom")

	tests := []struct {
		name      string
		steps     []func() (bool, error)
		wantFresh []bool
		wantErr   []error
		effects   int64
	}{
		{
			name: "second delivery of the same message is a duplicate",
			steps: []func() (bool, error){
				func() (bool, error) { return ib.Process(ctx, "m1", []byte("a"), writeEffect("m1")) },
				func() (bool, error) { return ib.Process(ctx, "m1", []byte("a"), writeEffect("m1")) },
			},
			wantFresh: []bool{true, false}, wantErr: []error{nil, nil}, effects: 1,
		},
		{
			name: "a failed handler rolls back the claim, so the retry is fresh",
			steps: []func() (bool, error){
				func() (bool, error) {
					return ib.Process(ctx, "m2", []byte("a"), func(tx *gorm.DB) error {
						if err := writeEffect("m2")(tx); err != nil {
							return err
						}
						return errBoom
					})
				},
				func() (bool, error) { return ib.Process(ctx, "m2", []byte("a"), writeEffect("m2")) },
			},
			wantFresh: []bool{false, true}, wantErr: []error{errBoom, nil}, effects: 1,
		},
		{
			name: "the same id with another payload is not silently dropped",
			steps: []func() (bool, error){
				func() (bool, error) { return ib.Process(ctx, "m3", []byte("a"), writeEffect("m3")) },
				func() (bool, error) { return ib.Process(ctx, "m3", []byte("b"), writeEffect("m3")) },
			},
			wantFresh: []bool{true, false}, wantErr: []error{nil, inbox.ErrPayloadMismatch}, effects: 1,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for j, step := range tt.steps {
				fresh, err := step()
				if fresh != tt.wantFresh[j] || !errors.Is(err, tt.wantErr[j]) {
					t.Fatalf("step %d: fresh=%v err=%v, want fresh=%v err=%v", j, fresh, err, tt.wantFresh[j], tt.wantErr[j])
				}
			}
			id := fmt.Sprintf("m%d", i+1)
			if got := count(t, db, "effects", id); got != tt.effects {
				t.Errorf("effects of %s = %d, want %d", id, got, tt.effects)
			}
			if got := count(t, db, "inbox", id); got != 1 {
				t.Errorf("inbox rows of %s = %d, want 1", id, got)
			}
		})
	}
}

// Two consumers receive the same message at the same moment: the second insert
// waits on the first transaction's primary-key entry and then inserts nothing.
func TestConcurrentDeliveriesApplyOnce(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	a, b := inbox.New(db, "payments"), inbox.New(db, "payments")
	for i := range 50 {
		id := fmt.Sprintf("race-%d", i)
		start := make(chan struct{})
		var wg sync.WaitGroup
		fresh := make([]bool, 2)
		errs := make([]error, 2)
		for k, ib := range []*inbox.Inbox{a, b} {
			wg.Go(func() {
				<-start
				fresh[k], errs[k] = ib.Process(ctx, id, []byte("body"), func(tx *gorm.DB) error {
					// Hold the transaction open so the other one is likely to block on it.
					time.Sleep(time.Millisecond)
					return writeEffect(id)(tx)
				})
			})
		}
		close(start)
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("%s: errors %v", id, errs)
		}
		if fresh[0] == fresh[1] {
			t.Fatalf("%s: fresh=%v, want exactly one fresh", id, fresh)
		}
		if got := count(t, db, "effects", id); got != 1 {
			t.Fatalf("%s: %d effects, want 1", id, got)
		}
	}
}

// A commit that fails must be reported, and must leave neither the claim nor
// the effects behind.
func TestCommitFailureIsReported(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	err := db.Exec(`CREATE TABLE deferred_unique (k int, CONSTRAINT k_unique UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`).Error
	if err != nil {
		t.Fatal(err)
	}
	ib := inbox.New(db, "payments")
	fresh, err := ib.Process(ctx, "c1", []byte("x"), func(tx *gorm.DB) error {
		// Both inserts succeed; the deferred constraint fails at COMMIT.
		return tx.Exec(`INSERT INTO deferred_unique VALUES (1), (1)`).Error
	})
	if err == nil || fresh {
		t.Fatalf("Process = fresh %v, err %v; want the commit error", fresh, err)
	}
	if got := count(t, db, "inbox", "c1"); got != 0 {
		t.Fatalf("inbox rows after failed commit = %d, want 0", got)
	}
}

// Group commit: one transaction for several messages, a savepoint each. An
// item whose writes fail, even with a statement error that aborts the
// transaction, rolls back alone; the others commit; an id seen twice in one
// batch is applied once.
func TestCommitBatch(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	ib := inbox.New(db, "payments")
	errBoom := errors.New("boom")
	items := []inbox.Item{
		{MessageID: "b1", Body: []byte("1"), Apply: writeEffect("b1")},
		{MessageID: "b2", Body: []byte("2"), Apply: func(tx *gorm.DB) error {
			if err := writeEffect("b2")(tx); err != nil {
				return err
			}
			return errBoom
		}},
		{MessageID: "b3", Body: []byte("3"), Apply: func(tx *gorm.DB) error {
			return tx.Exec(`INSERT INTO no_such_table VALUES (1)`).Error // aborts the transaction
		}},
		{MessageID: "b4", Body: []byte("4"), Apply: writeEffect("b4")},
		{MessageID: "b1", Body: []byte("1"), Apply: writeEffect("b1")},
		{MessageID: "b5", Body: []byte("5")}, // no writes: the inbox row alone
	}
	res, err := ib.Commit(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	freshB1 := 0
	for i, r := range res {
		if items[i].MessageID == "b1" && r.Fresh {
			freshB1++
		}
	}
	switch {
	case freshB1 != 1:
		t.Errorf("b1 fresh %d times in one batch, want once", freshB1)
	case !errors.Is(res[1].Err, errBoom) || res[1].Fresh:
		t.Errorf("b2 = %+v, want its own error", res[1])
	case res[2].Err == nil || res[2].Fresh:
		t.Errorf("b3 = %+v, want the statement's error", res[2])
	case !res[3].Fresh || res[3].Err != nil || !res[5].Fresh || res[5].Err != nil:
		t.Errorf("b4 = %+v, b5 = %+v, want both fresh", res[3], res[5])
	}
	for id, want := range map[string]int64{"b1": 1, "b2": 0, "b3": 0, "b4": 1, "b5": 0} {
		if got := count(t, db, "effects", id); got != want {
			t.Errorf("effects of %s = %d, want %d", id, got, want)
		}
	}
	for id, want := range map[string]int64{"b1": 1, "b2": 0, "b3": 0, "b4": 1, "b5": 1} {
		if got := count(t, db, "inbox", id); got != want {
			t.Errorf("inbox rows of %s = %d, want %d", id, got, want)
		}
	}
	// The failed ones are fresh on their retry.
	res, err = ib.Commit(ctx, []inbox.Item{{MessageID: "b2", Body: []byte("2"), Apply: writeEffect("b2")}, {MessageID: "b4", Body: []byte("4")}})
	if err != nil || !res[0].Fresh || res[1].Fresh {
		t.Fatalf("retry = %+v, %v; want b2 fresh and b4 a duplicate", res, err)
	}
}

// A COMMIT that fails for one item (a deferred constraint it breaks) costs
// that item alone: the batch is committed again item by item.
func TestCommitBatchFailureAtCommitIsIsolated(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	if err := db.Exec(`CREATE TABLE deferred_unique (k int, CONSTRAINT k_unique2 UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(`INSERT INTO deferred_unique VALUES (1)`).Error; err != nil {
		t.Fatal(err)
	}
	insert := func(k int) func(tx *gorm.DB) error {
		return func(tx *gorm.DB) error { return tx.Exec(`INSERT INTO deferred_unique VALUES (?)`, k).Error }
	}
	res, err := ib(db).Commit(ctx, []inbox.Item{
		{MessageID: "y1", Body: []byte("a"), Apply: insert(2)},
		{MessageID: "y2", Body: []byte("a"), Apply: insert(1)}, // breaks the constraint at COMMIT
		{MessageID: "y3", Body: []byte("a"), Apply: insert(3)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Fresh || res[1].Err == nil || !res[2].Fresh {
		t.Fatalf("results %+v: want y1 and y3 committed, y2 failed", res)
	}
	for id, want := range map[string]int64{"y1": 1, "y2": 0, "y3": 1} {
		if got := count(t, db, "inbox", id); got != want {
			t.Errorf("inbox rows of %s = %d, want %d", id, got, want)
		}
	}
}

func ib(db *gorm.DB) *inbox.Inbox { return inbox.New(db, "payments") }

// Two items that break a deferred constraint only together: the batch fails
// at COMMIT, and item by item the first commits and the second fails.
func TestCommitBatchConflictAtCommitKeepsTheFirst(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	if err := db.Exec(`CREATE TABLE deferred_unique (k int, CONSTRAINT k_unique UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`).Error; err != nil {
		t.Fatal(err)
	}
	insert := func(tx *gorm.DB) error { return tx.Exec(`INSERT INTO deferred_unique VALUES (1)`).Error }
	res, err := ib(db).Commit(ctx, []inbox.Item{{MessageID: "x1", Body: []byte("a"), Apply: insert}, {MessageID: "x2", Body: []byte("a"), Apply: insert}})
	if err != nil || !res[0].Fresh || res[1].Err == nil {
		t.Fatalf("results %+v, %v: want x1 committed and x2 failed", res, err)
	}
	for id, want := range map[string]int64{"x1": 1, "x2": 0} {
		if got := count(t, db, "inbox", id); got != want {
			t.Errorf("inbox rows of %s = %d, want %d", id, got, want)
		}
	}
}

func TestSeen(t *testing.T) {
	ctx := context.Background()
	db := setup(t)
	ib := inbox.New(db, "payments")
	if seen, err := ib.Seen(ctx, "s1", []byte("a")); seen || err != nil {
		t.Fatalf("Seen before = %v, %v", seen, err)
	}
	if _, err := ib.Process(ctx, "s1", []byte("a"), nil); err != nil {
		t.Fatal(err)
	}
	if seen, err := ib.Seen(ctx, "s1", []byte("a")); !seen || err != nil {
		t.Fatalf("Seen after = %v, %v", seen, err)
	}
	if _, err := ib.Seen(ctx, "s1", []byte("b")); !errors.Is(err, inbox.ErrPayloadMismatch) {
		t.Fatalf("Seen with another body = %v, want ErrPayloadMismatch", err)
	}
	if seen, _ := inbox.New(db, "other").Seen(ctx, "s1", []byte("a")); seen {
		t.Fatal("another consumer sees s1")
	}
}
