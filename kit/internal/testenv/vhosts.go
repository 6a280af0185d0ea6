package testenv

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest/erlnode"
)

// A rabbitmqctl call starts an Erlang VM: about 1 s of CPU and 2 to 4 s
// of a test's time on 2 cores, and a vhost took three (add, permissions,
// delete), most of a short test's time. In a test binary whose TestMain
// calls RunMain, VHost takes its vhosts from a pool made in batches: one
// eval deletes the vhosts the tests have released since the last batch and
// adds the next vhostBatch, each with the user's permissions; RunMain
// deletes what is left when the tests end. The eval goes through erl_call
// where it reaches the broker's node (localNode), else rabbitmqctl eval.
// Without RunMain, or once an eval failed both ways (another broker version), every vhost is added and
// deleted on its own with rabbitmqctl, as before. A test that failed has its vhost deleted
// at once: what it left running stops there, not in another test.
const vhostBatch = 8

// The pool is the test binary's (state of a test helper, like the programs
// RunMain removes): RunMain turns it on.
var vhostPool struct {
	sync.Mutex
	on       bool
	user     string
	free     []string
	released []string
}

// pooledVHost returns a vhost of the pool for user, or "" where the pool is
// off (the caller adds one on its own).
func pooledVHost(t testing.TB, user string) string {
	t.Helper()
	vhostPool.Lock()
	defer vhostPool.Unlock()
	if !vhostPool.on || (vhostPool.user != "" && vhostPool.user != user) {
		return ""
	}
	if len(vhostPool.free) == 0 {
		batch := make([]string, vhostBatch)
		prefix := namePrefix(t)
		for i := range batch {
			batch[i] = Name(prefix)
		}
		if err := vhostEval(vhostPool.released, batch, user); err != nil {
			// Part of the batch may exist: RunMain deletes it with the rest.
			vhostPool.released = append(vhostPool.released, batch...)
			fmt.Fprintf(os.Stderr, "testenv: vhosts in batches failed, adding them one by one: %v\n", err)
			vhostPool.on = false
			return ""
		}
		vhostPool.user, vhostPool.free, vhostPool.released = user, batch, nil
	}
	v := vhostPool.free[len(vhostPool.free)-1]
	vhostPool.free = vhostPool.free[:len(vhostPool.free)-1]
	return v
}

// releaseVHost gives a pooled vhost back, to be deleted with the next batch
// or at the end; a failed test's at once.
func releaseVHost(t testing.TB, v string) {
	if t.Failed() {
		Ctl(t, "delete_vhost", v)
		return
	}
	vhostPool.Lock()
	defer vhostPool.Unlock()
	vhostPool.released = append(vhostPool.released, v)
}

// drainVHostPool deletes every vhost the pool still holds (RunMain, once
// the tests have ended).
func drainVHostPool() error {
	vhostPool.Lock()
	defer vhostPool.Unlock()
	gone := append(vhostPool.released, vhostPool.free...)
	vhostPool.on, vhostPool.free, vhostPool.released = false, nil, nil
	if len(gone) == 0 {
		return nil
	}
	return vhostEval(gone, nil, "")
}

// vhostEval deletes the vhosts gone and adds those of add, each with all
// permissions for user, in one eval: on the broker's node by erl_call where
// it reaches it, else (or when that failed) by rabbitmqctl eval.
func vhostEval(gone, add []string, user string) error {
	bins := func(names []string) string {
		q := make([]string, len(names))
		for i, n := range names {
			q[i] = erlnode.Binary(n)
		}
		return "[" + strings.Join(q, ",") + "]"
	}
	// A delete may throw (a vhost of a failed batch that was never added):
	// caught, so that the rest goes on.
	expr := fmt.Sprintf(`[catch rabbit_vhost:delete(V, <<"testenv">>) || V <- %s], `+
		`[begin case rabbit_vhost:exists(V) of true -> ok; false -> ok = rabbit_vhost:add(V, <<"testenv">>) end, `+
		`ok = rabbit_auth_backend_internal:set_permissions(%s, V, <<".*">>, <<".*">>, <<".*">>, <<"testenv">>) end || V <- %s], ok.`,
		bins(gone), erlnode.Binary(user), bins(add))
	if n, ok := localNode(); ok {
		out, err := n.Result(expr)
		if err == nil && out == "ok" {
			return nil
		}
		// Once more through rabbitmqctl: the deletes are caught, and a vhost
		// that exists is not added again, so part of it done is no harm.
		fmt.Fprintf(os.Stderr, "testenv: a vhost batch through erl_call failed (%v, value %q): through rabbitmqctl\n", err, out)
	}
	out, err := ctl(2*time.Minute, "-q", "eval", expr)
	if err != nil || strings.TrimSpace(out) != "ok" {
		return fmt.Errorf("rabbitmqctl eval: %v: %s", err, strings.TrimSpace(out))
	}
	return nil
}

var (
	theNode     erlnode.Node
	theNodeOK   bool
	theNodeOnce sync.Once
)

// localNode is the node of the tests' broker (TEST_AMQP_URL) where erl_call
// reaches it (erlnode.Of) and TEST_RABBITMQCTL is unset (a command of one's
// own says where the broker is).
func localNode() (erlnode.Node, bool) {
	theNodeOnce.Do(func() {
		if os.Getenv(CtlEnv) == "" {
			theNode, theNodeOK = erlnode.Of(getenv(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/"))
		}
	})
	return theNode, theNodeOK
}
