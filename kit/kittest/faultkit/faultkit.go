// Package faultkit runs the fault scenarios of the fault kit against any
// service on the kit, from its own tests: the service's replicas run as real
// processes (kittest.Program), a supervisor starts again each one that dies
// (as systemd, Kubernetes or Docker's restart policy would) and arms its
// crash points again, and the faults are the real ones: crash points,
// SIGKILL, the broker closing every connection, the database terminating
// every session.
//
// A service's test gives each scenario a fresh Trial (its replicas, its load
// and its own invariants); Run injects the fault under the load, waits for
// the load and the drain, checks what the kit promises of every service
// (every replica consuming again, nothing left in the work and retry
// queues, the buffered inbox or the outbox) and then the service's
// invariants:
//
//	faultkit.Run(t, faultkit.Scenarios("after-carrier-book"), func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
//		s := faultkit.Start(t, faultkit.Config{Program: service, Replicas: sc.Replicas, AMQPURL: …, DBURL: …})
//		return &faultkit.Trial{Stack: s, Load: …, Progress: …, Verify: …}
//	})
package faultkit

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/kittest/erlnode"
)

// Config is the service under fault.
type Config struct {
	Program  *testenv.Program
	Replicas int // 1 or more
	// AMQPURL and DBURL are the run's vhost and the service's database
	// (kittest.VHost, kittest.Postgres); both are in every replica's
	// environment, with Env.
	AMQPURL, DBURL string
	Env            []string
	// Sinks are queues of the vhost that no replica consumes (where a
	// downstream service would read the events the service emits): the
	// drain does not wait for them.
	Sinks []string
	// Cluster, when the trial runs on the local three-node cluster
	// (AMQPURL is then its URL, every node): the node-loss scenario kills
	// and starts its nodes.
	Cluster *testenv.Cluster
}

// Stack is a service's replicas under a supervisor, and the faults.
type Stack struct {
	t        testing.TB
	cfg      Config
	replicas []*replica
	// Crashes counts the replicas found exited at a crash point (the exit
	// status faults.ExitCode) that the stack did not kill; Kills the
	// SIGKILLs it sent to live replicas; Restarts the replicas it started
	// again. Any other exit of a replica fails the test.
	Crashes, Kills, Restarts int
	// UnderLoad counts the faults the scenario injected while its load was
	// still being published.
	UnderLoad int
	notes     []string
	// phaseCrashes is what the last CrashPhase counted; backlog the outbox
	// backlog BrokerStopOutboxBacklog saw.
	phaseCrashes, backlog int
	// clearAlarm clears the memory alarm MemoryAlarm raised.
	clearAlarm func()
	// chaosRan counts the actions of a chaos run by name.
	chaosRan map[string]int
	// view is what the stack sees of the broker and the database.
	view view
}

// newStack is a stack of no replicas yet.
func newStack(t testing.TB, cfg Config) *Stack {
	s := &Stack{t: t, cfg: cfg}
	s.view = view{t: t, cfg: &s.cfg, note: s.Note}
	return s
}

// view is what the stack sees of the broker and the database: the vhost's
// queues and the stored backlog, for Pending, Drain and their failures.
type view struct {
	t    testing.TB
	cfg  *Config
	note func(format string, args ...any)
}

// Broker is the faults of the trial's broker (Stack.Broker); each supervises
// the stack's replicas while it lasts.
type Broker struct{ s *Stack }

// Broker returns the faults of the trial's broker: its connections closed,
// the app stopped, a memory alarm, a cluster node's leader killed.
func (s *Stack) Broker() Broker { return Broker{s: s} }

type replica struct {
	proc  *testenv.Process
	alive bool // as the supervisor last saw it
	armed []Arm
	held  bool // stopped on purpose: not started again
}

// Arm is a crash point armed with a probability per message (1: the next).
type Arm struct {
	Point string
	P     float64
}

// Start starts the replicas, each ready, and kills them when the test ends.
func Start(t testing.TB, cfg Config) *Stack {
	t.Helper()
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	s := newStack(t, cfg)
	env := append([]string{"AMQP_URL=" + cfg.AMQPURL, "DATABASE_URL=" + cfg.DBURL, "LOG_LEVEL=info"}, cfg.Env...)
	for range cfg.Replicas {
		s.replicas = append(s.replicas, &replica{proc: cfg.Program.Start(t, env...), alive: true})
	}
	return s
}

// T is the test the stack runs in, for a service's own scenarios.
func (s *Stack) T() testing.TB { return s.t }

// Getenv is a variable of the replicas' environment as Config.Env sets it
// (where the service's own dependencies are, for its scenarios), "" if
// unset.
func (s *Stack) Getenv(name string) string {
	v := ""
	for _, kv := range s.cfg.Env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// Replicas is the number of replicas.
func (s *Stack) Replicas() int { return len(s.replicas) }

// Process is replica i (0-based) as it runs now.
func (s *Stack) Process(i int) *testenv.Process { return s.replicas[i].proc }

// Note adds a line to what the run reports about its fault.
func (s *Stack) Note(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	s.notes = append(s.notes, line)
	s.t.Logf("fault: %s", line)
}

// Notes is what the run noted about its fault.
func (s *Stack) Notes() []string { return s.notes }

// Supervise starts again every replica that died and is not held, and arms
// its crash points again; a death the stack did not cause counts as a
// crash.
func (s *Stack) Supervise() {
	s.t.Helper()
	for i, r := range s.replicas {
		if r.held || !r.proc.Exited() {
			continue
		}
		if r.alive {
			if code := r.proc.ExitCode(); code != faults.ExitCode {
				s.t.Errorf("replica %d exited with status %d, not at a crash point (%d): the fault broke it\n%s",
					i, code, faults.ExitCode, tail(r.proc.Out.String(), 20))
			} else {
				s.Crashes++
			}
		}
		r.alive = false
		s.Restarts++
		r.proc.Revive(s.t)
		r.alive = true
		s.arm(r)
	}
}

// SuperviseFor keeps the replicas up for d.
func (s *Stack) SuperviseFor(d time.Duration) {
	s.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		s.Supervise()
		time.Sleep(200 * time.Millisecond)
	}
}

// SuperviseWhile keeps the replicas up while busy holds, for at most
// timeout (then it fails the test).
func (s *Stack) SuperviseWhile(timeout time.Duration, what string, busy func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for busy() {
		if time.Now().After(deadline) {
			s.t.Fatalf("still %s after %s", what, timeout)
		}
		s.Supervise()
		time.Sleep(200 * time.Millisecond)
	}
}

// Kill sends SIGKILL to replica i and reports whether it was running (a
// replica that died meanwhile, even between the look and the signal, is
// left to the supervisor, which checks its exit status, and not counted);
// the supervisor starts it again.
func (s *Stack) Kill(i int) bool {
	s.t.Helper()
	r := s.replicas[i]
	if r.proc.Exited() {
		return false
	}
	r.proc.Kill(s.t)
	if r.proc.ExitCode() != -1 {
		return false // it exited by itself before the signal: not ours
	}
	r.alive = false
	s.Kills++
	return true
}

// KillRandom sends SIGKILL to a live replica at random and returns which
// (-1 if none was running).
func (s *Stack) KillRandom() int {
	s.t.Helper()
	for _, i := range rand.Perm(len(s.replicas)) {
		if s.Kill(i) {
			return i
		}
	}
	return -1
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// Hold stops replica i (SIGKILL) and keeps it stopped; Release starts it
// again.
func (s *Stack) Hold(i int) {
	s.t.Helper()
	s.Kill(i)
	s.replicas[i].held = true
}

// Release starts a held replica again and waits until it is alive
// (/healthz), as a supervisor does: it may rightly be not ready (under a
// memory alarm, its relay reports the broker blocking publishing). A CI run
// caught the wait for /readyz here, which passed only when the probe came
// before the relay's first publish. Drain and Consuming check readiness
// once the fault is over.
func (s *Stack) Release(i int) {
	s.t.Helper()
	r := s.replicas[i]
	r.held = false
	s.Restarts++
	r.proc.Revive(s.t)
	r.alive = true
	s.arm(r)
}

// ArmAll arms the crash points on every replica, now and after each restart
// (none: disarm).
func (s *Stack) ArmAll(arms ...Arm) {
	s.t.Helper()
	for _, r := range s.replicas {
		r.armed = arms
		if !r.proc.Exited() {
			s.arm(r)
		}
	}
}

// arm clears the replica's crash points and arms those it keeps, each call
// tried three times. A replica that dies meanwhile is armed when the
// supervisor starts it again; a live one that refuses fails the test, so
// that no point stays armed unseen. A crash point that fires during a call
// drops it before the process is seen to exit: a replica whose calls failed
// gets a few seconds to be seen exiting before it counts as live.
func (s *Stack) arm(r *replica) {
	s.t.Helper()
	calls := [][2]string{{http.MethodDelete, "http://" + r.proc.Addr + "/faults/crash"}}
	for _, a := range r.armed {
		calls = append(calls, [2]string{http.MethodPost,
			fmt.Sprintf("http://%s/faults/crash?at=%s&probability=%g", r.proc.Addr, url.QueryEscape(a.Point), a.P)})
	}
	for _, c := range calls {
		var err error = errNotTried
		for try := 0; try < 3 && err != nil && !r.proc.Exited(); try++ {
			err = faultsCall(r.proc, c[0], c[1])
		}
		if r.proc.Exited() || err != nil && r.proc.ExitsWithin(3*time.Second) {
			return
		}
		if err != nil {
			s.t.Fatalf("%s %s failed three times on a live replica (last: %v)", c[0], c[1], err)
		}
	}
}

var client = &http.Client{Timeout: 5 * time.Second}

var errNotTried = errors.New("not tried: the replica had exited")

// faultsCall makes one call to a replica's fault endpoints; the error says
// what it got instead of a 2xx.
func faultsCall(p *testenv.Process, method, u string) error {
	req, err := p.FaultsRequest(method, u)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// CrashPhase arms point with probability p on every replica and supervises
// for d, and then for as long as busy holds and fewer than min crashes were
// seen (two minutes at most: a load that goes on while the fault does would
// hold it forever for a point never reached); then it disarms and returns
// the crashes of the phase.
func (s *Stack) CrashPhase(point string, p float64, d time.Duration, min int, busy func() bool) int {
	s.t.Helper()
	before, start := s.Crashes, time.Now()
	s.ArmAll(Arm{Point: point, P: p})
	s.SuperviseFor(d)
	for limit := time.Now().Add(2 * time.Minute); s.Crashes-before < min && busy() && time.Now().Before(limit); {
		s.Supervise()
		time.Sleep(200 * time.Millisecond)
	}
	s.ArmAll()
	s.Supervise()
	n := s.Crashes - before
	s.phaseCrashes = n
	s.Note("the service killed itself %d times at %s (armed with probability %g a message for %s) and was started again each time",
		n, point, p, time.Since(start).Round(time.Second))
	return n
}

// CloseConnections makes the broker close every connection of the run's
// vhost: the replicas' and a publisher's.
func (b Broker) CloseConnections() {
	b.s.t.Helper()
	if b.s.cfg.Cluster != nil {
		b.s.cfg.Cluster.Ctl("close_all_connections", "-p", b.s.view.vhost(), "fault kit: connections dropped")
		return
	}
	testenv.CloseConnections(b.s.t, b.s.view.vhost(), "fault kit: connections dropped")
}

// eval evaluates expr on the trial's broker (the cluster's, or the
// machine's) and returns its value as rabbitmqctl eval prints it.
func (v *view) eval(expr string) string {
	v.t.Helper()
	if v.cfg.Cluster != nil {
		return v.cfg.Cluster.Eval(expr)
	}
	return testenv.Eval(v.t, expr)
}

func (v *view) vhost() string {
	first, _, _ := strings.Cut(v.cfg.AMQPURL, ",") // a cluster's nodes share it
	u, err := url.Parse(first)
	if err != nil {
		v.t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		return "/"
	}
	name, _ = url.PathUnescape(name)
	return name
}

// KillLeader SIGKILLs the cluster node that leads quorum queue q, waiting
// for the queue to have a leader first (an election after the last kill),
// and returns the node's number.
func (b Broker) KillLeader(q string) int {
	b.s.t.Helper()
	c := b.s.view.cluster()
	n := 0
	testenv.Eventually(b.s.t, time.Minute, "a leader of "+q, func() (bool, error) {
		n = c.Leader(q)
		return n != 0, nil
	})
	c.Kill(n)
	return n
}

// LeaderOtherThan waits, supervising the replicas, until a node other than
// n (which is down) leads quorum queue q, and returns it: the queue's other
// replicas elected it. A queue with every replica on n gets none within a
// minute, and the test fails saying so.
func (b Broker) LeaderOtherThan(q string, n int) int {
	b.s.t.Helper()
	c := b.s.view.cluster()
	deadline := time.Now().Add(time.Minute)
	for {
		if m := c.Leader(q); m != 0 && m != n {
			return m
		}
		if time.Now().After(deadline) {
			b.s.t.Fatalf("no node but %d, which is down, leads %s a minute after it went: the queue's replicas are not on the three nodes", n, q)
		}
		b.s.SuperviseFor(time.Second)
	}
}

// StartNode starts cluster node n again, supervising the replicas while it
// boots.
func (b Broker) StartNode(n int) {
	b.s.t.Helper()
	b.s.view.cluster().Start(n)
	b.s.Supervise()
}

func (v *view) cluster() *testenv.Cluster {
	if v.cfg.Cluster == nil {
		v.t.Fatal("this scenario runs on a cluster: the trial must set Config.Cluster")
	}
	return v.cfg.Cluster
}

// StopBroker stops the broker application (rabbitmqctl stop_app)
// for d, supervising the replicas meanwhile, and starts it
// again. It stops every vhost: only for tests that run alone. If the test
// ends meanwhile, its cleanup starts the broker again.
func (b Broker) Stop(d time.Duration) {
	b.s.t.Helper()
	restarted := false
	b.s.t.Cleanup(func() {
		if !restarted {
			testenv.StartApp(b.s.t)
		}
	})
	testenv.StopApp(b.s.t)
	b.s.t.Logf("fault: broker stopped for %s", d)
	b.s.SuperviseFor(d)
	testenv.StartApp(b.s.t)
	restarted = true
	b.s.t.Logf("fault: broker started again")
}

// MemoryAlarm raises a memory alarm on the broker:
// every connection that publishes blocks, on every vhost.
// ClearMemoryAlarm clears it; the test's cleanup does if the test ends
// first.
func (b Broker) MemoryAlarm() {
	b.s.t.Helper()
	b.s.clearAlarm = testenv.MemoryAlarm(b.s.t)
}

// ClearMemoryAlarm sets the broker's memory watermark back.
func (b Broker) ClearMemoryAlarm() {
	if b.s.clearAlarm != nil {
		b.s.clearAlarm()
		b.s.clearAlarm = nil
	}
}

// outboxBacklog counts the outbox's events not yet sent.
func (v *view) outboxBacklog() int {
	return testenv.Count(v.t, v.cfg.DBURL, `SELECT count(*) FROM outbox WHERE status = 'pending'`)
}

// TerminateBackends terminates every session of the service's database
// (pg_terminate_backend) and returns how many. The server keeps running:
// it may be shared.
func (s *Stack) TerminateBackends() int {
	s.t.Helper()
	return testenv.Count(s.t, s.cfg.DBURL, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`)
}

// Pending counts what the service still has to do: the messages ready or
// unacked in the vhost's queues but the dead-letter queues and the sinks, the buffered
// inbox's messages not yet processed (pending, processing, failed), and the
// outbox's events not yet confirmed by the broker.
func (s *Stack) Pending() int {
	s.t.Helper()
	return s.view.queued() + s.view.stored()
}

// listQueues lists the vhost's queues: the cluster's or the machine's
// broker's, through erl_call where it reaches a node (kittest.Queues).
func (v *view) listQueues() []testenv.Queue {
	v.t.Helper()
	if v.cfg.Cluster != nil {
		return v.cfg.Cluster.Queues()
	}
	return testenv.Queues(v.t, v.vhost())
}

// queued counts the messages ready or unacked in the vhost's queues but the
// dead-letter queues and the sinks; a queue listed without counts counts as
// one pending.
func (v *view) queued() int {
	v.t.Helper()
	n := 0
	for _, q := range v.listQueues() {
		switch {
		case strings.HasSuffix(q.Name, ".dlq") || slices.Contains(v.cfg.Sinks, q.Name):
		case !q.Counted:
			n++
		default:
			n += q.Messages // the ready and the unacknowledged ones
		}
	}
	return n
}

// stored counts the buffered inbox's messages not yet processed and the
// outbox's events not yet confirmed: one query.
func (v *view) stored() int {
	v.t.Helper()
	return testenv.Count(v.t, v.cfg.DBURL, `SELECT (SELECT count(*) FROM inbox_messages WHERE status IN ('pending', 'processing', 'failed'))
		+ (SELECT count(*) FROM outbox WHERE status = 'pending')`)
}

// pendingDetail says where the pending work is, for a drain's failure:
// each queue of the vhost that holds a message (ready, unacked, and the
// quorum queue's leader: a retry queue whose messages outlived its TTL
// points at the broker's dead-lettering, not at the service), and the
// stored backlog by table.
func (v *view) pendingDetail() string {
	v.t.Helper()
	var b strings.Builder
	b.WriteString("queues holding messages (name, messages, ready, unacked, consumers, leader):\n")
	for _, q := range v.listQueues() {
		switch {
		case !q.Counted:
			fmt.Fprintf(&b, "  %s  (no count: no leader)\n", q.Name)
		case q.Messages > 0:
			fmt.Fprintf(&b, "  %s  %d  %d  %d  %d  %s", q.Name, q.Messages, q.Ready, q.Unacked, q.Consumers, q.Leader)
			if q.Consumers == 0 && !strings.HasSuffix(q.Name, ".dlq") && !strings.Contains(q.Name, ".retry.") &&
				!slices.Contains(v.cfg.Sinks, q.Name) {
				b.WriteString("  (no consumer: if no replica reads it, as a downstream service's queue, name it in Config.Sinks)")
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(&b, "buffered inbox not processed: %d; outbox pending: %d",
		testenv.Count(v.t, v.cfg.DBURL, `SELECT count(*) FROM inbox_messages WHERE status IN ('pending', 'processing', 'failed')`),
		v.outboxBacklog())
	return b.String()
}

// strandedRetryQueues are the vhost's retry queues that hold messages
// neither ready nor unacked: expired, dead-lettered and not yet forwarded
// to the work queue by the broker's at-least-once dead-letter worker.
func (v *view) strandedRetryQueues() []string {
	v.t.Helper()
	var out []string
	for _, q := range v.listQueues() {
		if q.Counted && strings.Contains(q.Name, ".retry.") && q.Messages > q.Ready+q.Unacked {
			out = append(out, q.Name)
		}
	}
	return out
}

// deadLetterWorkerDefect reports whether the cluster's RabbitMQ is older
// than 3.10.20: its quorum queues' at-least-once dead-letter worker can
// fail to start on a leader elected while the previous one's was starting
// (fixed in rabbitmq-server 3.10.20: "Terminate replaced
// rabbit_fifo_dlx_worker", "Do not restart DLX worker if leader is
// non-local"). A retry queue then keeps its expired messages until its
// leader changes again.
func (v *view) deadLetterWorkerDefect() bool {
	v.t.Helper()
	var major, minor, patch int
	if _, err := fmt.Sscanf(strings.Trim(v.eval("rabbit_misc:version()."), `"`), "%d.%d.%d", &major, &minor, &patch); err != nil {
		return false
	}
	return major == 3 && (minor < 10 || minor == 10 && patch < 20)
}

// nudgeStrandedRetryQueues moves the leadership of each stranded retry
// queue to another running node, where the broker starts the queue's
// dead-letter worker anew: the remedy for the defect above (an operator's
// is the same, or a restart of the leader's node; an upgrade ends it). It
// returns the queues it moved.
func (v *view) nudgeStrandedRetryQueues() []string {
	v.t.Helper()
	var moved []string
	for _, q := range v.strandedRetryQueues() {
		out := strings.TrimSpace(v.eval(fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(%s, queue, %s)), `+
			`{_, L} = amqqueue:get_pid(Q), `+
			`rabbit_quorum_queue:transfer_leadership(Q, hd(rabbit_nodes:all_running() -- [L])).`, erlnode.Binary(v.vhost()), erlnode.Binary(q))))
		// {migrated, Node} when the leader moved; {not_migrated, Why}
		// otherwise, which restarts nothing and is no progress.
		if !strings.HasPrefix(out, "{migrated,") {
			v.note("BROKER DEFECT (RabbitMQ before 3.10.20): retry queue %s kept expired messages its dead-letter worker did not forward; moving its leadership failed: %s", q, out)
			continue
		}
		v.note("BROKER DEFECT (RabbitMQ before 3.10.20): retry queue %s kept expired messages its dead-letter worker did not forward; its leadership was moved to restart the worker: %s",
			q, out)
		moved = append(moved, q)
	}
	return moved
}

// statsTick is how often RabbitMQ refreshes the counts rabbitmqctl
// list_queues shows (collect_statistics_interval, 5 s by default): a quorum
// queue whose leader was just elected lists 0 until its first tick.
const statsTick = 5 * time.Second

// Drain supervises until nothing is pending and progress (the service's
// effects: a count of rows) stood still over two polls a second apart (on a
// cluster, over more than one refresh of the broker's counts). It
// fails when neither progress rose nor the stored backlog (the buffered
// inbox's and the outbox's) shrank for stall with work pending, or a
// minute before go test's -timeout: a backlog on a loaded machine drains
// as slowly as it must, a wedged service fails within stall. The broker's
// queues are counted only in a poll where the rest holds (nothing stored
// pending, progress still): a drain of a minute is then a few listings
// of the queues, not one a poll.
func (s *Stack) Drain(stall time.Duration, progress func() int) {
	s.t.Helper()
	last, quiet, quietSince := -1, 0, time.Time{}
	// On a cluster the quiet must outlast a refresh of the queues' counts:
	// a queue that changed leader lists 0 until its new leader's first.
	var quietSpan time.Duration
	if s.cfg.Cluster != nil {
		quietSpan = statsTick + time.Second
	}
	moved := testenv.NewProgress(s.t, stall)
	best, fewest, lastStored := -1, math.MaxInt, math.MaxInt
	defect := s.cfg.Cluster != nil && s.view.deadLetterWorkerDefect()
	// A stranded retry queue is looked for once the drain stood still for
	// three refreshes of the broker's counts (it was 30 s while each look
	// booted a rabbitmqctl VM; through erl_call a look is cheap).
	nudgeAfter, nudges := min(3*statsTick, stall/2), 0
	for quiet < 2 || time.Since(quietSince) < quietSpan {
		s.Supervise()
		n, stored := progress(), s.view.stored()
		if n > best || stored < fewest {
			moved.Advanced()
		}
		// The backlog's low mark follows it up: a backlog that refilled
		// (the outbox while the broker was away) makes progress again as
		// it drains, not only below its old low.
		best, fewest = max(best, n), min(fewest, stored)
		if stored > lastStored {
			fewest = stored
		}
		lastStored = stored
		// stored again after queued: a message may move from a queue to
		// the buffered inbox while the queues are listed.
		if n == last && stored == 0 && s.view.queued() == 0 && s.view.stored() == 0 {
			if quiet == 0 {
				quietSince = time.Now()
			}
			quiet++
		} else {
			quiet = 0
			// On a cluster whose broker has the dead-letter worker's
			// defect, a drain that stood still for a while looks for a
			// retry queue it stranded and moves its leader (three times a
			// drain at most, each counted as progress: a stall that
			// moving leaders does not end still fails).
			if defect && nudges < 3 && moved.Still() >= nudgeAfter {
				if len(s.view.nudgeStrandedRetryQueues()) > 0 {
					moved.Advanced()
					nudges++
				}
			}
			if err := moved.Over(); err != nil {
				s.t.Fatalf("not drained: %v, with %d pending, progress %d\n%s", err, s.Pending(), n, s.view.pendingDetail())
			}
		}
		last = n
		time.Sleep(time.Second)
	}
}

// Consuming checks that every replica is consuming again (/readyz 200
// within 30 s): one alive but wedged hides behind a healthy one, since the
// queues drain all the same.
func (s *Stack) Consuming() {
	s.t.Helper()
	for i, r := range s.replicas {
		if r.held {
			continue
		}
		testenv.Eventually(s.t, 30*time.Second, fmt.Sprintf("replica %d consuming again (/readyz 200)", i), func() (bool, error) {
			if r.proc.Exited() {
				return false, fmt.Errorf("replica %d exited", i)
			}
			resp, err := client.Get("http://" + r.proc.Addr + "/readyz")
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
	}
}

// MetricSum is the sum of a metric over the live replicas (a replica's
// counters start again from zero when it restarts).
func (s *Stack) MetricSum(name string, labels ...string) float64 {
	s.t.Helper()
	var sum float64
	for _, r := range s.replicas {
		if !r.proc.Exited() {
			sum += r.proc.Metric(s.t, name, labels...)
		}
	}
	return sum
}

// CountLogged counts the replicas' log lines, across restarts, that hold
// every one of texts.
func (s *Stack) CountLogged(texts ...string) int {
	n := 0
	for _, r := range s.replicas {
		for line := range strings.SplitSeq(r.proc.Logs(), "\n") {
			all := line != ""
			for _, x := range texts {
				all = all && strings.Contains(line, x)
			}
			if all {
				n++
			}
		}
	}
	return n
}
