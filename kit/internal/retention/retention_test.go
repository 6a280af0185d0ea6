package retention

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

const day = 24 * time.Hour

func TestMinWindow(t *testing.T) {
	tests := []struct {
		name     string
		delays   []time.Duration
		attempts int
		want     time.Duration
	}{
		{"service defaults stay at the one-day floor", []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}, 5, day},
		{"one attempt never retries", []time.Duration{20 * time.Hour}, 1, day},
		{"the last delay repeats, doubled", []time.Duration{6 * time.Hour, 12 * time.Hour}, 4, 2 * (6 + 12 + 12) * time.Hour},
		{"longest configurable budget", []time.Duration{day}, 100, 2 * 99 * day},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MinWindow(tt.delays, tt.attempts); got != tt.want {
				t.Errorf("MinWindow = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	valid := Config{Consumer: "c", Window: 60 * time.Hour, BatchSize: 10,
		RetryDelays: []time.Duration{6 * time.Hour, 12 * time.Hour}, MaxAttempts: 4}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr error // nil: valid; errAny: any error
	}{
		{"window equal to the horizon", func(*Config) {}, nil},
		{"window below the horizon", func(c *Config) { c.Window = 59 * time.Hour }, ErrWindowTooShort},
		{"window below the one-day floor", func(c *Config) { c.Window, c.MaxAttempts = 23*time.Hour, 1 }, ErrWindowTooShort},
		{"no batch", func(c *Config) { c.BatchSize = 0 }, errAny},
		{"batch too large", func(c *Config) { c.BatchSize = MaxBatchSize + 1 }, errAny},
		{"no consumer", func(c *Config) { c.Consumer = "" }, errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.change(&cfg)
			_, err := New(nil, cfg, nil, testenv.Logger(t))
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("rejected: %v", err)
			case tt.wantErr == errAny && err == nil, tt.wantErr != nil && tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

var errAny = errors.New("any error")

// inboxDB is a migrated payments database for one test.
type inboxDB struct {
	t   *testing.T
	db  *sql.DB
	url string
}

func newInboxDB(t *testing.T) *inboxDB {
	t.Helper()
	gdb, url := testenv.MigratedDB(t, migrations.Inbox)
	db, err := gdb.DB()
	if err != nil {
		t.Fatal(err)
	}
	return &inboxDB{t: t, db: db, url: url}
}

// seed inserts n inbox rows of consumer received age ago.
func (d *inboxDB) seed(consumer, prefix string, n int, age time.Duration) {
	d.t.Helper()
	_, err := d.db.Exec(`
		INSERT INTO inbox (message_id, consumer, payload_sha256, received_at)
		SELECT $1 || g, $2, sha256(g::text::bytea), now() - make_interval(secs => $3)
		FROM generate_series(1, $4) g`, prefix, consumer, age.Seconds(), n)
	if err != nil {
		d.t.Fatal(err)
	}
}

func (d *inboxDB) count(where string, args ...any) int {
	d.t.Helper()
	var n int
	if err := d.db.QueryRow(`SELECT count(*) FROM inbox WHERE `+where, args...).Scan(&n); err != nil {
		d.t.Fatal(err)
	}
	return n
}

func (d *inboxDB) pruner(db *sql.DB, batch int, pause time.Duration) *Pruner {
	d.t.Helper()
	p, err := New(db, Config{Consumer: "payments", Window: 14 * day, BatchSize: batch, Pause: pause,
		RetryDelays: []time.Duration{time.Second}, MaxAttempts: 5}, NewMetrics(prometheus.NewRegistry()), testenv.Logger(d.t))
	if err != nil {
		d.t.Fatal(err)
	}
	return p
}

func TestPruneDeletesOldRowsInBatches(t *testing.T) {
	tests := []struct {
		name              string
		old, fresh, batch int
		wantBatches       int
	}{
		{"full batches then a partial one", 25, 5, 10, 3},
		{"an exact multiple ends with an empty batch", 20, 5, 10, 3},
		{"nothing old", 0, 5, 10, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newInboxDB(t)
			d.seed("payments", "old-", tt.old, 14*day+time.Hour)
			d.seed("payments", "fresh-", tt.fresh, 14*day-time.Hour)
			d.seed("shipping", "other-", 7, 30*day) // another consumer's rows are not ours to prune
			p := d.pruner(d.db, tt.batch, 0)

			res, err := p.Prune(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if res.Skipped || res.Deleted != int64(tt.old) || res.Batches != tt.wantBatches {
				t.Errorf("result %+v, want %d deleted in %d batches", res, tt.old, tt.wantBatches)
			}
			if n := d.count(`consumer = 'payments' AND message_id LIKE 'fresh-%'`); n != tt.fresh {
				t.Errorf("%d fresh rows left, want %d", n, tt.fresh)
			}
			if n := d.count(`consumer = 'payments' AND message_id LIKE 'old-%'`); n != 0 {
				t.Errorf("%d old rows left", n)
			}
			if n := d.count(`consumer = 'shipping'`); n != 7 {
				t.Errorf("%d rows of another consumer left, want 7", n)
			}
			if got := testutil.ToFloat64(p.metrics.pruned.WithLabelValues("payments")); got != float64(tt.old) {
				t.Errorf("inbox_pruned_rows_total = %v, want %d", got, tt.old)
			}
		})
	}
}

func TestPendingCountsWithoutDeleting(t *testing.T) {
	d := newInboxDB(t)
	d.seed("payments", "old-", 30, 20*day)
	d.seed("payments", "fresh-", 4, time.Hour)
	n, err := d.pruner(d.db, 10, 0).Pending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n.Rows != 30 || n.Messages != 0 || time.Since(n.Cutoff) < 14*day {
		t.Errorf("pending %+v, want 30 rows before 14 days ago", n)
	}
	if left := d.count(`true`); left != 34 {
		t.Errorf("%d rows left, want all 34", left)
	}
}

// Two replicas prune at once, each through its own pool: the one that finds the
// lock taken skips, and together they delete every old row exactly once.
func TestConcurrentPrunersTakeTurns(t *testing.T) {
	d := newInboxDB(t)
	const old, fresh = 400, 10
	d.seed("payments", "old-", old, 20*day)
	d.seed("payments", "fresh-", fresh, time.Hour)
	other, err := database.Open(context.Background(), database.Options{URL: d.url, MaxConns: 2}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(other) })
	otherDB, err := other.DB()
	if err != nil {
		t.Fatal(err)
	}
	// Pauses make the first run last over a second, so the second one starts inside it.
	pruners := []*Pruner{d.pruner(d.db, 100, 300*time.Millisecond), d.pruner(otherDB, 100, 300*time.Millisecond)}
	results := make([]Result, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	prune := func(i int) { wg.Go(func() { results[i], errs[i] = pruners[i].Prune(context.Background()) }) }

	prune(0)
	testenv.Eventually(t, 30*time.Second, "the first batch", func() (bool, error) {
		return d.count(`true`) < old+fresh, nil
	})
	prune(1)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !results[1].Skipped || results[0].Skipped {
		t.Fatalf("results %+v: want the second run skipped while the first held the lock", results)
	}
	if got := results[0].Deleted + results[1].Deleted; got != old {
		t.Errorf("deleted %d in total, want %d", got, old)
	}
	if n := d.count(`true`); n != fresh {
		t.Errorf("%d rows left, want %d", n, fresh)
	}
	// The lock was released: the other replica runs now, and no session holds it.
	if res, err := pruners[1].Prune(context.Background()); err != nil || res.Skipped || res.Deleted != 0 {
		t.Errorf("a later run: %+v, %v; want it to run and find nothing", res, err)
	}
	// This database's alone: the server's other tests take advisory locks of
	// their own (their migrations), as a CI run caught.
	var locks int
	if err := d.db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks != 0 {
		t.Errorf("%d advisory locks still held", locks)
	}
}

func TestRunPrunesOnScheduleUntilStopped(t *testing.T) {
	d := newInboxDB(t)
	d.seed("payments", "a-", 30, 20*day)
	p := d.pruner(d.db, 10, 0)
	p.cfg.Interval = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	testenv.Eventually(t, 30*time.Second, "the run at start", func() (bool, error) { return d.count(`true`) == 0, nil })
	d.seed("payments", "b-", 5, 20*day)
	testenv.Eventually(t, 30*time.Second, "a scheduled run", func() (bool, error) { return d.count(`true`) == 0, nil })
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunWithoutIntervalReturns(t *testing.T) {
	d := newInboxDB(t)
	d.seed("payments", "a-", 3, 20*day)
	p := d.pruner(d.db, 10, 0) // Interval 0
	p.Run(context.Background())
	if n := d.count(`true`); n != 3 {
		t.Errorf("%d rows left, want 3: a disabled schedule must not prune", n)
	}
}
