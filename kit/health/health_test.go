package health

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
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
// check again; a caller that waits for another's run gives up with its
// context.
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

	// A run cut short by its caller's context is not kept: the next caller
	// runs the check again.
	clock = clock.Add(time.Second)
	answer = nil
	gone, leave := context.WithCancel(ctx)
	c.check = func(context.Context) error { runs++; leave(); return gone.Err() }
	if err := check(gone); !errors.Is(err, context.Canceled) || runs != 3 {
		t.Fatalf("a run whose caller left: %v after %d runs, want context.Canceled after 3", err, runs)
	}
	c.check = func(context.Context) error { runs++; return answer }
	if err := check(ctx); err != nil || runs != 4 {
		t.Fatalf("after a run whose caller left: %v after %d runs, want nil from a new run, the 4th", err, runs)
	}

	c.turn <- struct{}{} // another caller's run under way
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := check(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller whose context ended while another ran the check = %v, want context.Canceled", err)
	}
	<-c.turn
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
