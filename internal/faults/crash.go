// Package faults holds the crash points of the payment service: named places in
// the flow of a message where an armed process ends itself as abruptly as
// SIGKILL (no deferred cleanup, no ack, no rollback of ours), so that the fault
// scripts can show what the inbox and the idempotency keys do about it. The
// points are armed over HTTP only when FAULTS_ENABLED=true; otherwise no
// Crasher exists and each point costs one nil check.
package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/inbox-template/payment-service/internal/consumer"
	"github.com/inbox-template/payment-service/internal/gateway"
)

// Point names a place in the flow of a message.
type Point string

// The crash points, in the order a message passes them. Three are stages of
// the consumer runtime (it reports them through Config.OnStage), one is in the
// payment flow.
const (
	AfterInboxInsert   = Point(consumer.StageClaimed)   // inbox row inserted, transaction open
	AfterGatewayCharge = Point("after-gateway-charge")  // card charged, payment not yet written
	AfterCommit        = Point(consumer.StageCommitted) // committed, not acked: the classic duplicate
	AfterAck           = Point(consumer.StageAcked)     // acked: nothing to redo
)

// Points lists every crash point.
var Points = []Point{AfterInboxInsert, AfterGatewayCharge, AfterCommit, AfterAck}

// arming is how a point fires: once on the next message, or on each message
// with a probability.
type arming struct {
	once        bool
	probability float64
}

// Crasher kills the process at armed points.
type Crasher struct {
	mu    sync.Mutex
	armed map[Point]arming
	die   func(Point)
}

// ExitCode is the status of a process ended by a crash point: the one a shell
// reports for a SIGKILLed process, so supervisors and scripts treat both alike.
const ExitCode = 137

// NewCrasher returns a Crasher that ends its own process at an armed point.
func NewCrasher() *Crasher {
	return &Crasher{armed: map[Point]arming{}, die: exitNow}
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
	if !slices.Contains(Points, point) {
		return fmt.Errorf("unknown crash point %q (want one of %v)", point, Points)
	}
	if !(probability >= 0 && probability <= 1) {
		return fmt.Errorf("probability must be between 0 and 1, got %v", probability)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed[point] = arming{once: probability == 0, probability: probability}
	return nil
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

// OnStage is the consumer runtime's stage hook.
func (c *Crasher) OnStage(s consumer.Stage) { c.Hit(Point(s)) }

// Handler serves POST /faults/crash?at=POINT[&probability=P] (204) and
// DELETE /faults/crash (disarm all, 204).
func (c *Crasher) Handler() http.Handler {
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

// Charger is the payment handler's view of the gateway.
type Charger interface {
	Charge(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error)
}

// CrashAfterCharge wraps a gateway client so that the after-gateway-charge
// point fires once the gateway has answered with a charge.
func CrashAfterCharge(next Charger, c *Crasher) Charger {
	return chargerFunc(func(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error) {
		ch, err := next.Charge(ctx, req)
		if err == nil {
			c.Hit(AfterGatewayCharge)
		}
		return ch, err
	})
}

type chargerFunc func(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error)

func (f chargerFunc) Charge(ctx context.Context, req gateway.ChargeRequest) (gateway.Charge, error) {
	return f(ctx, req)
}
