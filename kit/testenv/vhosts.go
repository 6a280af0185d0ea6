package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// A rabbitmqctl call starts an Erlang VM: about 1.5 s of CPU and 2 to 4 s
// of a test's time on 2 cores, and a vhost took three (add, permissions,
// delete), most of a short test's time. In a test binary whose TestMain
// calls RunMain, VHost takes its vhosts from a pool made in batches: one
// eval deletes the vhosts the tests have released since the last batch and
// adds the next vhostBatch, each with the user's permissions; RunMain
// deletes what is left when the tests end. The eval goes through erl_call
// where it reaches the broker's node (localNode), else rabbitmqctl eval.
// Without RunMain, for a user name that is not plain, or once an eval
// failed (another broker version), every vhost is added and deleted on its
// own with rabbitmqctl, as before. A test that failed has its vhost deleted
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

// plainName is what the pool writes into Erlang binaries unquoted.
var plainName = regexp.MustCompile(`^[A-Za-z0-9_.@-]+$`)

// pooledVHost returns a vhost of the pool for user, or "" where the pool is
// off (the caller adds one on its own).
func pooledVHost(t testing.TB, user string) string {
	t.Helper()
	vhostPool.Lock()
	defer vhostPool.Unlock()
	if !vhostPool.on || !plainName.MatchString(user) || (vhostPool.user != "" && vhostPool.user != user) {
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
// permissions for user, in one rabbitmqctl eval.
func vhostEval(gone, add []string, user string) error {
	bins := func(names []string) string {
		q := make([]string, len(names))
		for i, n := range names {
			q[i] = `<<"` + n + `">>`
		}
		return "[" + strings.Join(q, ",") + "]"
	}
	// A delete may throw (a vhost of a failed batch that was never added):
	// caught, so that the rest goes on.
	expr := fmt.Sprintf(`[catch rabbit_vhost:delete(V, <<"testenv">>) || V <- %s], `+
		`[begin ok = rabbit_vhost:add(V, <<"testenv">>), `+
		`ok = rabbit_auth_backend_internal:set_permissions(<<"%s">>, V, <<".*">>, <<".*">>, <<".*">>, <<"testenv">>) end || V <- %s], ok.`,
		bins(gone), user, bins(add))
	if n := localNode(); n.name != "" {
		out, err := n.eval(expr)
		if err != nil || out != "{ok, ok}" {
			return fmt.Errorf("erl_call -n %s: %v: %s", n.name, err, out)
		}
		return nil
	}
	out, err := ctl(2*time.Minute, "-q", "eval", expr)
	if err != nil || strings.TrimSpace(out) != "ok" {
		return fmt.Errorf("rabbitmqctl eval: %v: %s", err, strings.TrimSpace(out))
	}
	return nil
}

// erlNode is the broker's Erlang node, reached by erl_call (Erlang's own
// client, a C program: about 15 ms of CPU a call, where rabbitmqctl boots a
// VM). The batches went through rabbitmqctl until December 2026: a CI run
// made about 240 calls, some 200 s of CPU.
type erlNode struct {
	name string // "" where erl_call is not used
	home string // a HOME holding the node's cookie (.erlang.cookie)
}

var (
	theNode     erlNode
	theNodeOnce sync.Once
)

// localNode is the broker's node if erl_call can reach it: rabbitmqctl is
// the default one (TEST_RABBITMQCTL unset), erl_call is on PATH, the
// cookie is readable (in HOME, or the rabbitmq user's, as for root), and
// the node has an AMQP listener on the port of TEST_AMQP_URL, on this
// machine. The node is RABBITMQ_NODENAME, else NODENAME of
// /etc/rabbitmq/rabbitmq-env.conf, else rabbit@ the short host name, as
// rabbitmqctl finds it. Otherwise (or if an erl_call fails: vhostEval's
// caller then adds vhosts one by one) rabbitmqctl does it all.
func localNode() erlNode {
	theNodeOnce.Do(func() {
		if os.Getenv(CtlEnv) != "" {
			return
		}
		if _, err := exec.LookPath("erl_call"); err != nil {
			return
		}
		u, err := url.Parse(getenv(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/"))
		if err != nil || !slices.Contains([]string{"127.0.0.1", "localhost", "::1"}, u.Hostname()) {
			return
		}
		port := u.Port()
		if port == "" {
			port = "5672"
		}
		n := erlNode{name: nodeName()}
		for _, home := range []string{os.Getenv("HOME"), "/var/lib/rabbitmq"} {
			if f, err := os.Open(filepath.Join(home, ".erlang.cookie")); err == nil {
				_ = f.Close()
				n.home = home
				break
			}
		}
		if n.name == "" || n.home == "" {
			return
		}
		out, err := n.eval(`[element(6, L) || L <- rabbit_networking:node_listeners(node()), element(3, L) =:= amqp].`)
		if err != nil || !slices.Contains(strings.FieldsFunc(out, func(r rune) bool { return r < '0' || r > '9' }), port) {
			return
		}
		theNode = n
	})
	return theNode
}

// nodeName is the broker's node as rabbitmqctl would find it.
func nodeName() string {
	if n := os.Getenv("RABBITMQ_NODENAME"); n != "" {
		return n
	}
	if b, err := os.ReadFile("/etc/rabbitmq/rabbitmq-env.conf"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "NODENAME="); ok {
				return strings.Trim(v, `"'`)
			}
		}
	}
	host, err := os.Hostname()
	if err != nil {
		return ""
	}
	short, _, _ := strings.Cut(host, ".")
	return "rabbit@" + short
}

// eval evaluates expr on the node and returns what erl_call printed:
// {ok, Result}, or {error, Why} (exit status 0 all the same).
func (n erlNode) eval(expr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The cookie comes from HOME: on the command line (-c) it would show in
	// ps to every user of the machine.
	cmd := exec.CommandContext(ctx, "erl_call", "-n", n.name, "-timeout", "110", "-e") // #nosec G204 -- the node's name, as rabbitmqctl finds it
	cmd.Env = append(os.Environ(), "HOME="+n.home)
	cmd.Stdin = strings.NewReader(expr + "\n") // a form ends with a dot and a newline
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
