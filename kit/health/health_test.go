package health

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestReadinessExportsEachCheck: service_readiness is 1 for a passing
// check and 0 for a failing one, evaluated at each scrape.
func TestReadinessExportsEachCheck(t *testing.T) {
	failing := true
	reg := prometheus.NewRegistry()
	reg.MustRegister(Readiness(map[string]Check{
		"database": func(context.Context) error { return nil },
		"consumer": func(context.Context) error {
			if failing {
				return errors.New("stalled")
			}
			return nil
		},
	}))
	want := func(consumer string) string {
		return `# HELP service_readiness 1 while the readiness check passes, 0 while /readyz reports it failing.
# TYPE service_readiness gauge
service_readiness{check="consumer"} ` + consumer + `
service_readiness{check="database"} 1
`
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("0")), "service_readiness"); err != nil {
		t.Error(err)
	}
	failing = false
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("1")), "service_readiness"); err != nil {
		t.Error(err)
	}
}

// A cached check runs once a window: the callers within it get the last
// answer, a failure included, and the first caller after it runs the
// check again.
func TestCachedRunsTheCheckOnceAWindow(t *testing.T) {
	runs := 0
	var answer error
	c := newCached(func(context.Context) error { runs++; return answer }, time.Second)
	check := c.run
	clock := time.Unix(0, 0)
	c.now = func() time.Time { return clock }
	ctx := context.Background()
	for range 3 {
		if err := check(ctx); err != nil || runs != 1 {
			t.Fatalf("within the first window: %v after %d runs, want nil after 1", err, runs)
		}
	}
	answer = errors.New("database is read-only")
	clock = clock.Add(999 * time.Millisecond)
	if err := check(ctx); err != nil || runs != 1 {
		t.Fatalf("at the window's end: %v after %d runs, want the cached nil after 1", err, runs)
	}
	clock = clock.Add(time.Millisecond)
	if err := check(ctx); err != answer || runs != 2 {
		t.Fatalf("after the window: %v after %d runs, want the new failure after 2", err, runs)
	}
	clock = clock.Add(500 * time.Millisecond)
	if err := check(ctx); err != answer || runs != 2 {
		t.Fatalf("within the second window: %v after %d runs, want the cached failure after 2", err, runs)
	}

	// A caller whose context has ended, with no answer recent enough,
	// gets its context's error, not an old answer.
	clock = clock.Add(time.Minute)
	release := make(chan struct{})
	c.check = func(context.Context) error { <-release; return nil } // answers after the caller left
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := check(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller whose context ended, the last answer a minute old: %v, want context.Canceled", err)
	}
	close(release)
}

// A check slower than its callers can wait still answers them: its run goes
// on after the caller that started it gave up, and its answer is kept for
// the next callers; a caller that cannot wait for a run under way gets the
// answer before it while that is recent, and the check's own timeout bounds
// how stale it can be. Before, a run whose caller gave up was thrown away:
// a database that took longer to answer than a probe's budget (a loaded
// machine) failed every probe, and a replica never turned healthy.
func TestCachedSlowCheckAnswersTheNextCallers(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan error)
	runs := 0
	c := newCached(func(context.Context) error {
		runs++
		started <- struct{}{}
		return <-release
	}, time.Second)
	clock := time.Unix(0, 0)
	c.now = func() time.Time { return clock }
	answered := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.running == nil
	}

	// The first caller gives up before the answer.
	probe, giveUp := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- c.run(probe) }()
	<-started
	giveUp()
	if err := <-first; err == nil {
		t.Fatal("a caller that gave up before any answer got nil")
	}
	release <- nil // the database answers after all
	eventually(t, answered)
	if err := c.run(context.Background()); err != nil || runs != 1 {
		t.Fatalf("after the slow run: %v after %d runs, want its nil after 1", err, runs)
	}

	// Past the window, a caller that cannot wait for the new run gets the
	// answer before it, while that is at most the check's timeout and the
	// window old.
	clock = clock.Add(2 * time.Second)
	probe, giveUp = context.WithCancel(context.Background())
	go func() { first <- c.run(probe) }()
	<-started
	giveUp()
	if err := <-first; err != nil {
		t.Fatalf("a caller that cannot wait, with a recent answer: %v, want that answer (nil)", err)
	}
	clock = clock.Add(c.stale)
	probe, giveUp = context.WithCancel(context.Background())
	go func() { first <- c.run(probe) }()
	giveUp()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that cannot wait, with an answer too old: %v, want context.Canceled", err)
	}
	down := errors.New("connection refused")
	release <- down
	eventually(t, answered)
	if err := c.run(context.Background()); !errors.Is(err, down) || runs != 2 {
		t.Fatalf("after the second run: %v after %d runs, want its failure after 2", err, runs)
	}
}

// Callers of a shared check while a run is under way get that run's answer:
// a burst of them costs one run. After it nothing is kept: the next caller
// runs the check again.
func TestSharedCheckRunsOnceForABurst(t *testing.T) {
	release := make(chan struct{})
	var runs atomic.Int32
	down := errors.New("connection refused")
	c := newCached(func(context.Context) error { runs.Add(1); <-release; return down }, 0)
	const burst = 50
	answers := make(chan error, burst)
	for range burst {
		go func() { answers <- c.run(context.Background()) }()
	}
	eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.waiting == burst
	})
	close(release)
	for range burst {
		if err := <-answers; !errors.Is(err, down) {
			t.Fatalf("a caller of the burst got %v, want the run's answer %v", err, down)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("a burst of %d callers ran the check %d times, want 1", burst, n)
	}
	if err := c.run(context.Background()); !errors.Is(err, down) || runs.Load() != 2 {
		t.Fatalf("the next caller: %v after %d runs, want a new run, the 2nd", err, runs.Load())
	}
	// A caller that cannot wait for a run gets no earlier answer.
	c.check = func(context.Context) error { <-release; return nil }
	release = make(chan struct{})
	gone, leave := context.WithCancel(context.Background())
	leave()
	if err := c.run(gone); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that cannot wait: %v, want context.Canceled, not the earlier answer", err)
	}
	close(release)
}

// eventually waits until cond holds (a goroutine's step), failing the test
// after a long deadline.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the condition did not come within 30 s")
		}
	}
}

// TestProbeSaysWhichCheckFails: a failing probe (the container's health
// check) reports the failing check and its reason, so that Docker's health
// log shows why a replica is not ready, not only that it is not.
func TestProbeSaysWhichCheckFails(t *testing.T) {
	srv := httptest.NewServer(Mux(prometheus.NewRegistry(), map[string]Check{
		"database": func(context.Context) error { return nil },
		"outbox": func(context.Context) error {
			return errors.New("outbox relay not connected to the broker: dial refused")
		},
	}))
	defer srv.Close()
	err := Probe(context.Background(), srv.URL+"/readyz")
	if err == nil {
		t.Fatal("Probe passed against a failing check")
	}
	for _, want := range []string{"Service Unavailable", `"outbox":"outbox relay not connected to the broker: dial refused"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Probe's error %q does not contain %q", err, want)
		}
	}
	if err := Probe(context.Background(), srv.URL+"/healthz"); err != nil {
		t.Errorf("Probe of a passing endpoint: %v", err)
	}
}
