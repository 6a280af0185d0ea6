package database_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// lookupEnv is a table of 100 things (t0 … t99, each valued its number) and
// a Reader of its own on it.
func lookupEnv(t *testing.T) database.Reader {
	db, url := testenv.MigratedDB(t)
	if err := db.Exec(`CREATE TABLE things (name text PRIMARY KEY, n int NOT NULL);
		INSERT INTO things SELECT 't' || i, i FROM generate_series(0, 99) i`).Error; err != nil {
		t.Fatal(err)
	}
	r, err := database.OpenReader(context.Background(), database.Options{URL: url, MaxConns: 2}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func readThings(_ context.Context, tx *gorm.DB, names []string) (map[string]int, error) {
	var rows []struct {
		Name string
		N    int
	}
	if err := tx.Raw(`SELECT name, n FROM things WHERE name IN ?`, names).Scan(&rows).Error; err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.Name] = r.N
	}
	return out, nil
}

// TestLookupGathersConcurrentReadsIntoFewStatements: 200 readers at once,
// each of one key (half of them absent, some asked twice), get their own
// answers from far fewer statements, none of more than the maximum keys.
func TestLookupGathersConcurrentReadsIntoFewStatements(t *testing.T) {
	r := lookupEnv(t)
	var statements, widest atomic.Int32
	l := database.NewLookup(r, 16, func(ctx context.Context, tx *gorm.DB, names []string) (map[string]int, error) {
		statements.Add(1)
		if int32(len(names)) > widest.Load() {
			widest.Store(int32(len(names)))
		}
		time.Sleep(2 * time.Millisecond) // a round trip's worth: let the callers pile up
		return readThings(ctx, tx, names)
	})
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			name := fmt.Sprintf("t%d", i%150) // t0…t49 asked twice; t100… absent
			n, found, err := l.Get(context.Background(), name)
			switch {
			case err != nil:
				errs <- err
			case i%150 < 100 && (!found || n != i%150):
				errs <- fmt.Errorf("%s: got %d, %v; want %d", name, n, found, i%150)
			case i%150 >= 100 && found:
				errs <- fmt.Errorf("%s: found %d, want absent", name, n)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s, w := statements.Load(), widest.Load(); s >= 100 || w > 16 {
		t.Errorf("%d statements, the widest of %d keys: want far fewer than 200, at most 16 keys", s, w)
	}
}

// TestALookupCallerGivingUpFailsNoOtherRead: the caller whose statement is in
// flight gives up; the statement runs on, and the keys asked meanwhile are
// read after it.
func TestALookupCallerGivingUpFailsNoOtherRead(t *testing.T) {
	r := lookupEnv(t)
	release := make(chan struct{})
	var first atomic.Bool
	l := database.NewLookup(r, 16, func(ctx context.Context, tx *gorm.DB, names []string) (map[string]int, error) {
		if first.CompareAndSwap(false, true) {
			<-release
			if ctx.Err() != nil {
				return nil, fmt.Errorf("the statement's context ended with its first caller: %w", ctx.Err())
			}
		}
		return readThings(ctx, tx, names)
	})
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, _, err := l.Get(ctx, "t1")
		gaveUp <- err
	}()
	testenv.Eventually(t, 5*time.Second, "the first statement in flight", func() (bool, error) { return first.Load(), nil })
	results := make(chan error, 2)
	for _, name := range []string{"t2", "t3"} {
		go func() {
			n, found, err := l.Get(context.Background(), name)
			if err == nil && (!found || fmt.Sprintf("t%d", n) != name) {
				err = fmt.Errorf("%s: got %d, %v", name, n, found)
			}
			results <- err
		}()
	}
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that gave up: %v, want context.Canceled", err)
	}
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
}

// TestLookupGivesEachCallerOfABatchItsError: a statement that fails fails
// every key it read, and the next one reads again.
func TestLookupGivesEachCallerOfABatchItsError(t *testing.T) {
	r := lookupEnv(t)
	var fail atomic.Bool
	fail.Store(true)
	l := database.NewLookup(r, 16, func(ctx context.Context, tx *gorm.DB, names []string) (map[string]int, error) {
		if fail.Load() {
			return nil, tx.Raw(`SELECT * FROM no_such_table`).Scan(&[]int{}).Error
		}
		return readThings(ctx, tx, names)
	})
	if _, _, err := l.Get(context.Background(), "t1"); err == nil {
		t.Fatal("a failed statement gave no error")
	}
	fail.Store(false)
	if n, found, err := l.Get(context.Background(), "t1"); err != nil || !found || n != 1 {
		t.Fatalf("after the failure: %d, %v, %v", n, found, err)
	}
}

// TestALookupReadThatPanicsFailsItsKeysAndNotTheProcess: the read runs on a
// goroutine of the Lookup's, where no handler middleware would recover it.
func TestALookupReadThatPanicsFailsItsKeysAndNotTheProcess(t *testing.T) {
	r := lookupEnv(t)
	l := database.NewLookup(r, 16, func(context.Context, *gorm.DB, []string) (map[string]int, error) {
		panic("a bug in the read")
	})
	if _, _, err := l.Get(context.Background(), "t1"); err == nil || !strings.Contains(err.Error(), "a bug in the read") {
		t.Fatalf("a panicking read: %v, want its panic as the error", err)
	}
}
