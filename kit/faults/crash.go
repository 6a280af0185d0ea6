// Package faults holds crash points: named places in the flow of a message where an armed process ends itself as abruptly as
// SIGKILL (no deferred cleanup, no ack, no rollback of ours), so that the fault
// scripts can show what the inbox and the idempotency keys do about it. The
// points are armed over HTTP only when FAULTS_ENABLED=true; otherwise no
// Crasher exists and each point costs one nil check. The runtime has five
// points (two of them the buffered mode's processing); a service declares its
// own around its side effects (After).
package faults

import (
	"context"
	"crypto/subtle"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
)

// Point names a place in the flow of a message.
type Point string

// The runtime's crash points, in the order a message passes them: each is
// the stage of the same name (the runtime's Stage…, the same string). A service
// declares its own, around its side effects, with After.
const (
	AfterInboxInsert = Point(consumer.StageInboxInsert) // inbox row inserted, transaction open
	AfterCommit      = Point(consumer.StageCommit)      // committed, not acked: the classic duplicate
	AfterAck         = Point(consumer.StageAck)         // acked: nothing to redo
	// The buffered mode's processing (its ingest passes the three above).
	AfterClaim         = Point(consumer.StageClaim)         // a stored message claimed, its handler not yet run
	AfterProcessCommit = Point(consumer.StageProcessCommit) // the handler's writes and the processed status committed
	// The outbox relay's (a service that publishes, kit.Service.Publishes):
	// a batch confirmed by the broker, not yet marked sent. It is published
	// again, with the same ids, after the restart.
	AfterOutboxPublish Point = "after-outbox-publish"
)

// RuntimePoints lists the crash points of the consumer runtime.
var RuntimePoints = []Point{AfterInboxInsert, AfterCommit, AfterAck, AfterClaim, AfterProcessCommit}

// arming is how a point fires: once on the next message, or on each message
// with a probability.
type arming struct {
	once        bool
	probability float64
}

// Crasher ends the process at armed points.
type Crasher struct {
	mu     sync.Mutex
	points []Point // every point that can be armed
	armed  map[Point]arming
	die    func(Point)
}

// ExitCode is the status of a process ended by a crash point: the one a shell
// reports for a SIGKILLed process, so supervisors and scripts treat both alike.
const ExitCode = 137

// NewCrasher returns a Crasher that ends its own process at an armed point.
func NewCrasher() *Crasher {
	return &Crasher{points: slices.Clone(RuntimePoints), armed: map[Point]arming{}, die: exitNow}
}

// Declare adds a service's own point, so that it can be armed. Safe on a nil
// Crasher.
func (c *Crasher) Declare(point Point) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.points, point) {
		c.points = append(c.points, point)
	}
}

// Points lists every point that can be armed: the runtime's, then the
// service's in the order they were declared.
func (c *Crasher) Points() []Point {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.points)
}

// exitNow ends the process at once with exit_group(2): no deferred function,
// no ack, no rollback of ours runs; the kernel closes the sockets, as after a
// SIGKILL. It does not signal itself: a process that is PID 1 (a container
// without an init) ignores signals it has no handler for, SIGKILL from itself
// included, and would hang at the crash point instead of dying.
func exitNow(point Point) {
	fmt.Fprintf(os.Stderr, "crash point %s: exiting with status %d\n", point, ExitCode)
	syscall.Exit(ExitCode)
}

// Arm makes point fire on the next message (probability 0) or on each message
// with the given probability (0 < p <= 1).
func (c *Crasher) Arm(point Point, probability float64) error {
	if !(probability >= 0 && probability <= 1) {
		return fmt.Errorf("probability must be between 0 and 1, got %v", probability)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.points, point) {
		return fmt.Errorf("unknown crash point %q (want one of %v)", point, c.points)
	}
	c.armed[point] = arming{once: probability == 0, probability: probability}
	return nil
}

// Armed lists the points armed now.
func (c *Crasher) Armed() []Point {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Point, 0, len(c.armed))
	for p := range c.armed {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Disarm clears every point.
func (c *Crasher) Disarm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.armed)
}

// Hit is called at point; if it is armed, the process dies here. Safe on a nil
// Crasher, which never fires.
func (c *Crasher) Hit(point Point) {
	if c == nil || !c.fires(point) {
		return
	}
	c.die(point)
}

func (c *Crasher) fires(point Point) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.armed[point]
	switch {
	case !ok:
		return false
	case a.once:
		delete(c.armed, point)
		return true
	}
	return rand.Float64() < a.probability
}

// Handler serves POST /faults/crash?at=POINT[&probability=P] (204) and
// DELETE /faults/crash (disarm all, 204). With a token (FAULTS_TOKEN), a
// request without "Authorization: Bearer <token>" answers 401 and changes
// nothing; "" serves anyone, for a listener on loopback only (the
// configuration refuses it otherwise).
func (c *Crasher) Handler(token string) http.Handler { return Guard(token, c.mux()) }

// Guard serves h only to a request with "Authorization: Bearer <token>"
// (the scheme in any case, as RFC 7235 has it; the token compared in
// constant time), and answers 401 to any other, h untouched; with token ""
// it is h. For every fault endpoint (the fake gateway's too).
func Guard(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="faults"`)
			http.Error(w, "the fault endpoints need Authorization: Bearer <FAULTS_TOKEN>", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (c *Crasher) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /faults/crash", func(w http.ResponseWriter, r *http.Request) {
		p := 0.0
		if s := r.URL.Query().Get("probability"); s != "" {
			var err error
			if p, err = strconv.ParseFloat(s, 64); err != nil {
				http.Error(w, "probability: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		if err := c.Arm(Point(r.URL.Query().Get("at")), p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /faults/crash", func(w http.ResponseWriter, _ *http.Request) {
		c.Disarm()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// After wraps call, a side effect of a service, with the crash point point:
// an armed process ends right after the call succeeds, before anything of the
// message is committed. It declares point on c; with a nil c (faults
// disabled) it returns call itself.
func After[Req, Resp any](c *Crasher, point Point, call func(context.Context, Req) (Resp, error)) func(context.Context, Req) (Resp, error) {
	if c == nil {
		return call
	}
	c.Declare(point)
	return func(ctx context.Context, req Req) (Resp, error) {
		resp, err := call(ctx, req)
		if err == nil {
			c.Hit(point)
		}
		return resp, err
	}
}
