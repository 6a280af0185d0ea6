package database_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// A pool smaller than the workers is busy most of the time: the check must not
// wait behind it (a readiness probe timing out would be taken for an outage).
// The Checker has a connection of its own.
func TestCheckerDoesNotWaitForABusyPool(t *testing.T) {
	dbURL := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := database.Open(ctx, database.Options{URL: dbURL, MaxConns: 2, StatementTimeout: 10 * time.Second}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(pool) })
	var busy sync.WaitGroup
	for range 2 {
		busy.Go(func() { pool.Exec(`SELECT pg_sleep(3)`) })
	}
	t.Cleanup(busy.Wait)
	testenv.Eventually(t, 30*time.Second, "both pooled connections taken", func() (bool, error) {
		sqlDB, err := pool.DB()
		return err == nil && sqlDB.Stats().InUse == 2, err
	})
	pingCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := database.Ping(pingCtx, pool); err == nil {
		t.Fatal("the pool answered a ping while both its connections slept: the test proves nothing")
	}
	checker, err := database.NewChecker(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = checker.Close() })
	checkCtx, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if err := checker.Check(checkCtx); err != nil {
		t.Fatalf("check while the pool is busy: %v", err)
	}
}

// A database that answers but takes no writes fails the check.
func TestCheckerSeesReadOnly(t *testing.T) {
	dbURL := testenv.Postgres(t)
	ctx := context.Background()
	u, _ := url.Parse(dbURL)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	checker, err := database.NewChecker(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = checker.Close() })
	if err := checker.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+strings.TrimPrefix(u.Path, "/")+" SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if err := checker.Check(ctx); !errors.Is(err, database.ErrReadOnly) {
		t.Fatalf("check of a read-only database = %v, want ErrReadOnly", err)
	}
}

// Recycle closes the pool's idle sessions: the next statements run on new ones.
func TestRecycleRenewsSessions(t *testing.T) {
	dbURL := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := database.Open(ctx, database.Options{URL: dbURL, MaxConns: 4, StatementTimeout: 5 * time.Second, AppName: "recycled"}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(pool) })
	var pids []int
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 3 { // three sessions at once
		wg.Go(func() {
			var pid int
			pool.Raw(`SELECT pg_backend_pid() FROM pg_sleep(0.2)`).Row().Scan(&pid)
			mu.Lock()
			pids = append(pids, pid)
			mu.Unlock()
		})
	}
	wg.Wait()
	database.Recycle(pool)
	var pid int
	if err := pool.Raw(`SELECT pg_backend_pid()`).Row().Scan(&pid); err != nil {
		t.Fatal(err)
	}
	for _, old := range pids {
		if pid == old {
			t.Fatalf("a statement after Recycle ran on an old session (pid %d)", pid)
		}
	}
}
