package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest/erlnode"
)

// ClusterScriptEnv points the tests at the script that runs the local
// three-node cluster; by default scripts/cluster.sh of the module.
const ClusterScriptEnv = "TEST_CLUSTER_SCRIPT"

// Cluster is the local three-node RabbitMQ cluster of scripts/cluster.sh
// (cluster1..3@localhost), with a vhost of the test's own. A test that has
// one may kill and start its nodes: it holds the cluster alone (an exclusive
// lock across test processes) until it ends, or with the others of
// NewSharedCluster, one round of faults at a time; its cleanup starts every
// node it killed.
type Cluster struct {
	t      testing.TB
	script string
	vhost  string
	urls   []string // each node's URL into the vhost
	down   map[int]bool
}

// NewCluster starts the cluster if it is not up (scripts/cluster.sh up),
// waits for the lock, and creates a vhost for the test on it. It fails,
// never skips, where the cluster cannot run (it needs root).
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	return newCluster(t, syscall.LOCK_EX)
}

// NewSharedCluster is NewCluster for a test that may share the cluster with
// others of its kind, each on its vhost: it holds the cluster's lock
// shared (a test of NewCluster waits until none of them runs), and takes
// each node it kills in a Round, which holds the cluster's faults alone.
// Two such tests kill nodes in turn, never two nodes at once: the quorum
// queues keep a majority.
func NewSharedCluster(t testing.TB) *Cluster {
	t.Helper()
	return newCluster(t, syscall.LOCK_SH)
}

// Round waits until no other test of the cluster is in a round and holds
// the cluster's faults until end is called. end starts every node still
// down (a round that failed halfway) before it lets the next round begin:
// never two nodes down at once.
func (c *Cluster) Round() (end func()) {
	c.t.Helper()
	f := lockFile(c.t, ".rounds.lock", syscall.LOCK_EX)
	return func() {
		defer f.Close() // closing releases the lock
		for n := range c.down {
			c.Start(n)
		}
	}
}

func newCluster(t testing.TB, how int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, script: clusterScript(t), vhost: Name(namePrefix(t)), down: map[int]bool{}}
	f := lockFile(t, ".lock", how)
	t.Cleanup(func() { f.Close() })
	if how == syscall.LOCK_SH {
		// scripts/cluster.sh up starts a node that is down, and the vhost
		// is made on a live one: not while another test's round holds a
		// node down.
		end := c.Round()
		defer end()
	}
	up := c.run("up")
	var base []string
	for _, line := range strings.Split(strings.TrimSpace(up), "\n") {
		if strings.HasPrefix(line, "amqp://") {
			base = append(base, line)
		}
	}
	if len(base) != 3 {
		t.Fatalf("%s up printed %d AMQP URLs, want 3", c.script, len(base))
	}
	// The vhost is added and deleted by an eval on a live node (through
	// erl_call where it reaches one), each a no-op where it is done already:
	// a node that went down halfway through the call may have done it.
	v := erlnode.Binary(c.vhost)
	if out := c.Eval(`case rabbit_vhost:exists(` + v + `) of true -> ok; false -> rabbit_vhost:add(` + v + `, <<"testenv">>) end.`); out != "ok" {
		t.Fatalf("add vhost %s on the cluster: %s", c.vhost, out)
	}
	t.Cleanup(func() {
		for n := range c.down {
			c.Start(n)
		}
		if out := c.Eval(`case rabbit_vhost:exists(` + v + `) of true -> rabbit_vhost:delete(` + v + `, <<"testenv">>); false -> ok end.`); out != "ok" {
			t.Errorf("delete vhost %s on the cluster: %s", c.vhost, out)
		}
	})
	for _, b := range base {
		u, err := url.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.urls) == 0 {
			if out := c.Eval(`rabbit_auth_backend_internal:set_permissions(` + erlnode.Binary(u.User.Username()) + `, ` + v +
				`, <<".*">>, <<".*">>, <<".*">>, <<"testenv">>).`); out != "ok" {
				t.Fatalf("set permissions on vhost %s of the cluster: %s", c.vhost, out)
			}
		}
		u.Path = "/" + c.vhost
		c.urls = append(c.urls, u.String())
	}
	return c
}

// URL is AMQP_URL for the whole cluster: every node, separated by commas.
func (c *Cluster) URL() string { return strings.Join(c.urls, ",") }

// NodeURL is node n's URL alone (1 to 3).
func (c *Cluster) NodeURL(n int) string { return c.urls[n-1] }

// VHost is the test's vhost on the cluster.
func (c *Cluster) VHost() string { return c.vhost }

// Kill SIGKILLs node n: a crash, not a stop.
func (c *Cluster) Kill(n int) {
	c.t.Helper()
	c.down[n] = true
	c.run("kill", fmt.Sprint(n))
	c.t.Logf("cluster: node %d killed", n)
}

// Start starts node n again and waits until it runs.
func (c *Cluster) Start(n int) {
	c.t.Helper()
	c.run("start", fmt.Sprint(n))
	delete(c.down, n)
	c.t.Logf("cluster: node %d started", n)
}

// Ctl runs rabbitmqctl on a live node of the cluster.
func (c *Cluster) Ctl(args ...string) string {
	c.t.Helper()
	return c.run(append([]string{"ctl"}, args...)...)
}

// nodeName is node n's Erlang node name (scripts/cluster.sh's).
func nodeName(n int) string { return fmt.Sprintf("cluster%d@localhost", n) }

// liveNodes are the names of the nodes this test has not killed: those
// erl_call tries (a node another test's round holds down does not answer,
// and the next one is asked).
func (c *Cluster) liveNodes() []string {
	var names []string
	for n := 1; n <= 3; n++ {
		if !c.down[n] {
			names = append(names, nodeName(n))
		}
	}
	return names
}

// Queues lists the vhost's queues, asked of a live node through erl_call
// (see broker.go); through rabbitmqctl where no node answers it.
func (c *Cluster) Queues() []Queue {
	c.t.Helper()
	if qs, ok := queuesOn(c.liveNodes(), c.vhost); ok {
		return qs
	}
	out := c.Ctl(append([]string{"list_queues", "-q", "-p", c.vhost, "--formatter", "json"}, queueColumns...)...)
	qs, err := ParseQueues(out)
	if err != nil {
		c.t.Fatalf("cluster list_queues -p %s: %v", c.vhost, err)
	}
	return qs
}

// Eval evaluates expr (ended by a dot) on a live node and returns its value
// as rabbitmqctl eval prints it: through erl_call on the first node that
// answers, or rabbitmqctl where none does. A node that gives no answer (it
// went down during the call: another test's round may kill it) leaves the
// eval to the next one, so an expr must be safe to run twice; one that ran
// on a node and failed there fails the test.
func (c *Cluster) Eval(expr string) string {
	c.t.Helper()
	for _, name := range c.liveNodes() {
		n, ok := erlnode.At(name)
		if !ok {
			continue
		}
		out, err := n.Eval(expr)
		if errors.Is(err, erlnode.ErrNotReached) {
			c.t.Logf("eval on %s: %v: on the next node", name, err)
			continue
		}
		if err != nil {
			c.t.Fatalf("eval on %s: %v", name, err)
		}
		return out
	}
	return strings.TrimSpace(c.Ctl("eval", expr))
}

// Leader is the node (1 to 3) that leads quorum queue q of the vhost, 0 if
// none does (an election under way). It asks a live node by erl_call
// (scripts/cluster.sh leader), not rabbitmqctl: a fault round asks it every
// second while the load keeps the machine busy, where each rabbitmqctl call
// boots an Erlang VM.
func (c *Cluster) Leader(q string) int {
	c.t.Helper()
	out := strings.TrimSpace(c.run("leader", c.vhost, q))
	n, err := strconv.Atoi(out)
	if err != nil || n < 0 || n > 3 {
		c.t.Fatalf("%s leader %s %s printed %q, want a node number or 0", c.script, c.vhost, q, out)
	}
	return n
}

// Members is the number of nodes that hold a replica of quorum queue q.
func (c *Cluster) Members(q string) int {
	c.t.Helper()
	for _, line := range strings.Split(c.Ctl("list_queues", "-p", c.vhost, "--no-table-headers", "name", "members"), "\n") {
		if name, members, ok := strings.Cut(strings.TrimSpace(line), "\t"); ok && name == q {
			return strings.Count(members, "@")
		}
	}
	return 0
}

func (c *Cluster) run(args ...string) string {
	c.t.Helper()
	out, err := c.try(args...)
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", c.script, strings.Join(args, " "), err, out)
	}
	return out
}

// try runs scripts/cluster.sh. Its limit is above the script's own worst
// case (a start waits for another start of the node, up to 300 s, then up
// to 300 s for its own boot); at the limit the script's whole process group
// is killed, its rabbitmqctl and erl_call calls with it, which would
// otherwise keep the output pipe open and the call waiting.
func (c *Cluster) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// clusterScript finds scripts/cluster.sh in a directory above the test's.
func clusterScript(t testing.TB) string {
	if s := os.Getenv(ClusterScriptEnv); s != "" {
		return s
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		s := filepath.Join(dir, "scripts", "cluster.sh")
		if _, err := os.Stat(s); err == nil {
			return s
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no scripts/cluster.sh above the test's directory: set %s", ClusterScriptEnv)
		}
		dir = parent
	}
}

// lockFile takes a lock (how: syscall.LOCK_EX or LOCK_SH) of the file
// beside the cluster's data (CLUSTER_DIR, as scripts/cluster.sh has it)
// named with suffix, waiting for it: a lock across test processes, and
// between goroutines of one (each call opens the file anew). Closing the
// file releases it.
func lockFile(t testing.TB, suffix string, how int) *os.File {
	t.Helper()
	dir := os.Getenv("CLUSTER_DIR")
	if dir == "" {
		dir = "/tmp/rabbitmq-cluster"
	}
	f, err := os.OpenFile(dir+suffix, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		t.Fatalf("lock %s: %v", f.Name(), err)
	}
	return f
}
