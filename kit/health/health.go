// Package health serves the operational HTTP endpoints of a service: liveness
// (/healthz), readiness (/readyz) and Prometheus metrics (/metrics).
package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness condition; nil means ready.
type Check func(ctx context.Context) error

// Mux returns a mux with /healthz, /readyz and /metrics. Readiness runs every
// named check with a short timeout and reports each result.
func Mux(gatherer prometheus.Gatherer, checks map[string]Check) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		status, report := http.StatusOK, map[string]string{}
		for name, check := range checks {
			report[name] = "ok"
			if err := runCheck(r.Context(), check); err != nil {
				status, report[name] = http.StatusServiceUnavailable, err.Error()
			}
		}
		writeJSON(w, status, report)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}

// Cached returns check answered at most once a window, and as fast as its
// callers need: the check runs detached from them, under a timeout of its own
// (CheckTimeout), one run at a time, and its answer is kept whoever still
// waits for it. A caller within the window of the last answer gets that
// answer (a failure included); any other caller starts a run, or joins the
// one under way, and waits for it or for its context. A caller whose context
// ends first gets the last answer if it is at most the window and
// CheckTimeout old (the answer before the run under way), and else its
// context's error. So a check slower than a prober's budget (a dial on a
// loaded machine) still answers the next probe, and a check that hangs is
// reported failing within the window and CheckTimeout.
//
// A check that dials anew (the database's: a session of its own, about 30
// ms of CPU on a 2-core machine) then costs one session a window, however
// often /readyz is probed and /metrics scraped (a test polling a metric
// twenty times a second dialed twenty sessions a second).
func Cached(check Check, window time.Duration) Check { return newCached(check, window).run }

// Shared returns check with one run at a time shared by its callers: a
// caller while a run is under way waits for that run's answer (or for its
// context) instead of starting another. The run is Cached's, detached under
// CheckTimeout; nothing is kept after it, so the next caller runs the check
// again, and a caller whose context ends before the run's answer gets its
// context's error. A burst of callers (every worker of a consumer asking
// whether the database is up after their outside calls timed out at once)
// costs one check, not a queue of them behind a checker's single connection,
// where the queue alone outlasted the callers' timeouts and read as an outage.
func Shared(check Check) Check { return newCached(check, 0).run }

// CheckTimeout bounds one run of a Cached check.
const CheckTimeout = 5 * time.Second

func newCached(check Check, window time.Duration) *cached {
	c := &cached{check: check, window: window, now: time.Now}
	if window > 0 { // Shared keeps nothing past its run
		c.stale = window + CheckTimeout
	}
	return c
}

type cached struct {
	check  Check
	window time.Duration
	stale  time.Duration    // the oldest answer a caller that cannot wait gets
	now    func() time.Time // a variable for the tests

	mu      sync.Mutex
	waiting int // callers waiting for the run under way (for the tests)
	ran     bool
	at      time.Time     // when the last run ended
	last    error         // its answer
	running chan struct{} // closed when the run under way ends; nil when none
}

func (c *cached) run(ctx context.Context) error {
	c.mu.Lock()
	if c.ran && c.now().Sub(c.at) < c.window {
		defer c.mu.Unlock()
		return c.last
	}
	done := c.running
	if done == nil {
		done = make(chan struct{})
		c.running = done
		go c.runOnce(done) // #nosec G118 -- detached on purpose: the run outlives a caller that gave up, under its own timeout
	}
	c.waiting++
	c.mu.Unlock()
	answered := false
	select {
	case <-done:
		answered = true
	case <-ctx.Done():
		select { // both may be ready: the run's answer wins
		case <-done:
			answered = true
		default:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waiting--
	if c.ran && (answered || c.now().Sub(c.at) < c.stale) {
		return c.last
	}
	return fmt.Errorf("the check gave no answer in time: %w", ctx.Err())
}

// runOnce runs the check under its own timeout and keeps its answer.
func (c *cached) runOnce(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
	defer cancel()
	err := c.check(ctx)
	c.mu.Lock()
	c.last, c.ran, c.at, c.running = err, true, c.now(), nil
	c.mu.Unlock()
	close(done)
}

// Readiness exports the result of each check at every scrape as
// service_readiness{check} (1 ready, 0 not): the alert on a failing
// readiness needs no prober. Each check runs with a timeout of its own.
func Readiness(checks map[string]Check) prometheus.Collector { return readiness(checks) }

type readiness map[string]Check

var readinessDesc = prometheus.NewDesc("service_readiness", "1 while the readiness check passes, 0 while /readyz reports it failing.", []string{"check"}, nil)

func (r readiness) Describe(ch chan<- *prometheus.Desc) { ch <- readinessDesc }

func (r readiness) Collect(ch chan<- prometheus.Metric) {
	for name, check := range r {
		v := 1.0
		if !passes(check) {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(readinessDesc, prometheus.GaugeValue, v, name)
	}
}

// passes runs one check with a timeout of its own: one that hangs fails
// alone, not those after it.
func passes(check Check) bool { return runCheck(context.Background(), check) == nil }

// runCheck runs one check with a timeout of its own (a check that hangs
// fails alone, not those after it).
func runCheck(ctx context.Context, check Check) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return check(ctx)
}

// Pprof adds the runtime profiles of net/http/pprof under /debug/pprof/; a
// service serves them only when asked to (PPROF_ENABLED).
func Pprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Probe asks url for a 2xx answer; the programs use it as their `healthcheck`
// subcommand, so that a container image without a shell can be health-checked.
func Probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		// The answer's body names the failing check and why (/readyz's
		// report): Docker keeps it in the container's health log.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return &statusError{url: url, code: resp.StatusCode, body: strings.TrimSpace(string(body))}
	}
	return nil
}

type statusError struct {
	url  string
	code int
	body string
}

func (e *statusError) Error() string {
	msg := e.url + " answered " + http.StatusText(e.code)
	if e.body != "" {
		msg += ": " + e.body
	}
	return msg
}
