package faultkit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// Scenario is one fault, the same for every service on the kit.
type Scenario struct {
	Name     string
	Replicas int // how many replicas the trial starts
	// Fault injects the fault while the load runs (busy reports whether it
	// still does).
	Fault func(s *Stack, busy func() bool)
	// Check is the scenario's own check: the fault happened and had its
	// visible effect.
	Check func(t testing.TB, s *Stack)
	// OnCluster asks the trial for the local three-node cluster
	// (kittest.Cluster) in Config.Cluster, its URL as AMQPURL.
	OnCluster bool
	// WholeBroker says that the fault disturbs the whole broker (a stop, an
	// alarm), every vhost's clients: such a scenario runs alone.
	WholeBroker bool
	// FixedLoad says that the fault waits for the load to end: the trial's
	// LoadMore is not called.
	FixedLoad bool
}

// alone says whether the scenario must not run beside the others: it
// disturbs the whole broker, or it takes the cluster (whose lock would
// hold a parallel slot idle).
func (sc Scenario) alone() bool { return sc.WholeBroker || sc.OnCluster }

// Trial is one scenario's run against a service, built by the service's
// test: its replicas (Start), its load and its invariants.
type Trial struct {
	Stack *Stack
	// Load publishes the service's load at a bounded rate, while the fault
	// happens, and returns once the broker confirmed all of it.
	Load func() error
	// LoadMore is called after Load for as long as the fault is still being
	// injected (but for a FixedLoad scenario), and publishes one more batch
	// each time: every round of a fault loop finds the load running by
	// construction, however slow its rounds run (the CLI on a loaded
	// machine). Verify counts what every batch published. Without it, a
	// round that finds the load ended is not run, and the scenario's check
	// may fail for want of faults under load.
	LoadMore func() error
	// Progress counts the service's effects (rows of its own table): the
	// drain waits until it stands still, and fails when it (and the stored
	// backlog) stood still for DrainStall with work pending. It must be
	// bounded by the load (a row per order, say, not per attempt): a count
	// that can grow without end keeps a drain going until go test's
	// -timeout.
	Progress func() int
	// Verify checks the service's own invariants once everything drained:
	// every effect applied once, the duplicates suppressed, the poison
	// dead-lettered.
	Verify func(t *testing.T)
	// DrainStall is how long the drain may go without progress before it
	// fails (default 2 minutes); a drain that progresses runs until a
	// minute before go test's -timeout.
	DrainStall time.Duration
}

// Run runs each scenario as a subtest on a fresh trial: the load starts,
// the fault happens under it, the load ends (all confirmed), the replicas
// are kept up until everything drained, every replica must be consuming
// again, and then the scenario's check and the service's invariants run.
// Each trial has a vhost, databases and processes of its own, so the
// scenarios run in parallel (go test -parallel), but those that disturb the
// whole broker or take the cluster, which run one at a time. A test whose
// scenarios all run beside others may call t.Parallel itself, so that its
// trials share the slots with other tests' (a test that runs one of the
// others must not: its scenario would no longer run alone).
func Run(t *testing.T, scenarios []Scenario, trial func(t *testing.T, sc Scenario) *Trial) {
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			if !sc.alone() {
				t.Parallel()
			}
			tr := trial(t, sc)
			s := tr.Stack
			loaded := make(chan error, 1)
			var faulting atomic.Bool
			faulting.Store(true)
			go func() {
				err := tr.Load()
				for err == nil && tr.LoadMore != nil && !sc.FixedLoad && faulting.Load() {
					err = tr.LoadMore()
				}
				loaded <- err
			}()
			var loadErr error
			done := false
			busy := func() bool {
				if done {
					return false
				}
				select {
				case loadErr = <-loaded:
					done = true
					return false
				default:
					return true
				}
			}
			sc.Fault(s, busy)
			faulting.Store(false)
			if sc.OnCluster {
				// The drain and the checks hold the cluster's faults: a
				// test of another mode on the cluster kills no node until
				// they are done (a queue without a leader, or one just
				// elected, lists no count or 0: a drain could pass with
				// messages left). Its load keeps running meanwhile.
				end := s.view.cluster().Round()
				defer end()
			}
			s.SuperviseWhile(5*time.Minute, "publishing the load", busy)
			if loadErr != nil {
				t.Fatalf("the load: %v", loadErr)
			}
			stall := tr.DrainStall
			if stall == 0 {
				stall = 2 * time.Minute
			}
			s.Drain(stall, tr.Progress)
			s.Consuming()
			if sc.Check != nil {
				sc.Check(t, s)
			}
			tr.Verify(t)
			t.Logf("%s: %d crashes, %d kills, %d restarts", sc.Name, s.Crashes, s.Kills, s.Restarts)
		})
	}
}

// CrashAt is the crash-after-<point> scenario: point armed with probability
// p on every message of one replica for a while under load; each crash is
// followed by a restart, and the redeliveries must be suppressed or
// finished, never applied twice.
func CrashAt(point string, p float64) Scenario {
	return Scenario{
		Name:     "crash-" + point,
		Replicas: 1,
		Fault: func(s *Stack, busy func() bool) {
			s.SuperviseFor(time.Second)
			s.CrashPhase(point, p, 3*time.Second, 2, busy)
		},
		Check: func(t testing.TB, s *Stack) {
			// Crashes count exits with the crash points' own status only;
			// the log says which point it was.
			if logged := s.CountLogged("crash point " + point + ":"); s.phaseCrashes < 2 || logged < 2 {
				t.Errorf("the service crashed %d times in the phase, %d of them logged at %s; want at least 2 at %s",
					s.phaseCrashes, logged, point, point)
			}
			if point != "after-commit" {
				return
			}
			// Committed, not acked: the broker delivers it again and the
			// inbox finds it applied.
			n := s.CountLogged(`"msg":"message duplicate"`, `"redelivered":true`)
			s.Note("%d redelivered messages were found applied already and suppressed", n)
			if n == 0 {
				t.Errorf("no redelivery was suppressed as a duplicate after %d crashes between commit and ack", s.phaseCrashes)
			}
		},
	}
}

// underLoad runs inject up to n times while the load runs, supervising for
// a pause between rounds (pause returns it), and counts the rounds that
// found the load still running in s.UnderLoad.
func underLoad(s *Stack, busy func() bool, n int, pause func() time.Duration, inject func() bool) {
	s.SuperviseFor(time.Second)
	for i := 0; i < n && busy(); i++ {
		if inject() {
			s.UnderLoad++
		}
		s.SuperviseFor(pause())
	}
}

// checkUnderLoad fails the test unless at least min faults hit the load.
func checkUnderLoad(t testing.TB, s *Stack, what string, min int) {
	if s.UnderLoad < min {
		t.Errorf("%d %s while the load was published, want at least %d: make the trial's load last longer", s.UnderLoad, what, min)
	}
}

// checkReconnected is the check of a scenario that cuts the service's
// connections: at least min of them hit the load, the service reconnected
// at least twice, and no delivery was settled on a channel it did not come
// from.
func checkReconnected(t testing.TB, s *Stack, what string, min int) {
	checkUnderLoad(t, s, what, min)
	if n := s.MetricSum("consumer_reconnects_total"); n < 2 {
		t.Errorf("the service reconnected %v times after %d %s under load, want at least 2", n, s.UnderLoad, what)
	}
	if n := s.CountLogged("unknown delivery tag"); n != 0 {
		t.Errorf("%d log lines about an unknown delivery tag: a delivery settled on the wrong channel", n)
	}
}

// SIGKILLReplicas is the sigkill-replicas scenario: two replicas share the
// queue; one of them, at random, gets SIGKILL every second or so under load
// and is started again; what it held goes to the other or back to the
// queue. The load must last about ten seconds for three kills.
var SIGKILLReplicas = Scenario{
	Name:     "sigkill-replicas",
	Replicas: 2,
	Fault: func(s *Stack, busy func() bool) {
		underLoad(s, busy, 5, func() time.Duration { return time.Duration(700+rand.IntN(800)) * time.Millisecond }, func() bool {
			i := s.KillRandom()
			s.t.Logf("fault: SIGKILL replica %d", i)
			return i >= 0
		})
		s.Note("%d SIGKILLs at random moments to one of two replicas under load, each started again", s.UnderLoad)
	},
	Check: func(t testing.TB, s *Stack) { checkUnderLoad(t, s, "SIGKILLs", 3) },
}

// BrokerDropsConnections is the broker-drops-connections scenario: the
// broker closes every connection of the vhost (the replicas' and the
// publisher's) every second and a half under load; the service reconnects
// and never settles an old delivery on a new channel.
var BrokerDropsConnections = Scenario{
	Name:     "broker-drops-connections",
	Replicas: 1,
	Fault: func(s *Stack, busy func() bool) {
		underLoad(s, busy, 4, func() time.Duration { return 1500 * time.Millisecond }, func() bool {
			s.Broker().CloseConnections()
			return true
		})
		s.Note("the broker closed every connection of the vhost %d times under load", s.UnderLoad)
	},
	Check: func(t testing.TB, s *Stack) { checkReconnected(t, s, "connection drops", 3) },
}

// DatabaseSessionsTerminated is the database-restart scenario of a shared
// server: every session of the service's database is terminated every
// second under load; transactions cut short roll back, the messages are
// retried or put back, the service pauses while the database does not
// answer and resumes by itself.
var DatabaseSessionsTerminated = Scenario{
	Name:     "database-sessions-terminated",
	Replicas: 1,
	Fault: func(s *Stack, busy func() bool) {
		killed := 0
		underLoad(s, busy, 5, func() time.Duration { return time.Second }, func() bool {
			n := s.TerminateBackends()
			killed += n
			return n > 0
		})
		s.Note("every session of the service's database was terminated %d times under load (%d sessions)", s.UnderLoad, killed)
	},
	Check: func(t testing.TB, s *Stack) { checkUnderLoad(t, s, "rounds of sessions terminated", 3) },
}

// Scenarios is the catalogue every service runs in the inline mode: a crash
// at each of the kit's crash points and at each of the service's own
// points, two replicas killed at random, the broker dropping connections
// and the database terminating sessions. A service that publishes names
// the relay's point among its own ("after-outbox-publish"), and its
// unconsumed event queues in Config.Sinks.
func Scenarios(ownPoints ...string) []Scenario {
	return catalogue(append([]string{"after-inbox-insert", "after-commit", "after-ack"}, ownPoints...))
}

// BufferedScenarios is the catalogue of the buffered mode (INBOX_MODE=
// buffered in the trial's environment): its ingest passes the same three
// points, its processing two more of its own.
func BufferedScenarios(ownPoints ...string) []Scenario {
	return catalogue(append([]string{"after-inbox-insert", "after-commit", "after-ack", "after-claim", "after-process-commit"}, ownPoints...))
}

func catalogue(points []string) []Scenario {
	var out []Scenario
	for _, p := range points {
		out = append(out, CrashAt(p, 0.05))
	}
	return append(out, SIGKILLReplicas, BrokerDropsConnections, DatabaseSessionsTerminated)
}

// BrokerNodeLoss is the broker-node-loss scenario, on the local three-node
// cluster: two replicas consume queue (the work queue), their outbox relays
// publish, and the node that leads the queue gets SIGKILL under load, kills
// times, each started again after a few seconds; one of the losses lasts
// longer than the replicas' reconnect backoff (set RECONNECT_MAX_WAIT to at
// most 2s). The quorum queues elect another leader, which redelivers what
// was unacked; the replicas on the lost node reconnect to another, and the
// load's publisher too. Nothing may be lost, charged twice or dead-lettered
// that was valid: QUEUE_DELIVERY_LIMIT counts each loss of a node once for
// every delivery then unacked, so it must stay well above kills.
func BrokerNodeLoss(queue string, kills int) Scenario {
	return Scenario{
		Name:      "broker-node-loss",
		Replicas:  2,
		OnCluster: true,
		Fault: func(s *Stack, busy func() bool) {
			var nodes, next []int
			// The round whose node stays down past the backoff: the middle
			// one, the first of two, so that a failover follows a
			// reconnect past the backoff.
			long := (kills - 1) / 2
			underLoad(s, busy, kills, func() time.Duration { return 2 * time.Second }, func() bool {
				down := 3 * time.Second
				if len(nodes) == long {
					down = 10 * time.Second
				}
				// Tests of other modes may share the cluster (each on its
				// vhost): one node down at a time, by the cluster's round.
				end := s.view.cluster().Round()
				defer end()
				n := s.Broker().KillLeader(queue)
				s.t.Logf("fault: node %d, the leader of %s, killed for %s", n, queue, down)
				nodes = append(nodes, n)
				s.SuperviseFor(down)
				// The failover itself: another node leads the queue while n
				// is down (a queue with all its replicas on n gets none, and
				// the test fails here). Counted per round, not from the next
				// round's kill: with another mode's rounds between, the
				// leadership may be back on the same node by then.
				next = append(next, s.Broker().LeaderOtherThan(queue, n))
				s.Broker().StartNode(n)
				return true
			})
			s.Note("the node leading %s was killed %d times under load (nodes %v; the leaders elected meanwhile %v), once for 10 s",
				queue, s.UnderLoad, nodes, next)
		},
		Check: func(t testing.TB, s *Stack) {
			checkUnderLoad(t, s, "leader kills", kills)
			if n := s.MetricSum("consumer_broker_failovers_total"); n < 1 {
				t.Errorf("no replica's consumer failed over to another node (consumer_broker_failovers_total %v)", n)
			}
			if n := s.CountLogged("unknown delivery tag"); n != 0 {
				t.Errorf("%d log lines about an unknown delivery tag: a delivery settled on the wrong channel", n)
			}
			s.Note("consumer failovers %v, outbox relay failovers %v", s.MetricSum("consumer_broker_failovers_total"),
				s.MetricSum("outbox_relay_broker_failovers_total"))
		},
	}
}

// The broker scenarios stop the whole broker or raise an alarm on it: every
// vhost and every other client of it is disturbed. Run them on their own
// (the Makefile's disruptive pass: -tags disruptive -p 1), never beside
// other tests of a shared broker.

// BrokerRestart is the broker-restart scenario: RabbitMQ stops (stop_app)
// for 4 s under load and starts again, twice. The service sees its
// connection die, reports not ready, reconnects with backoff, declares its
// topology again and consumes; deliveries of the dead channel are never
// settled on the new one; the load republishes what was not confirmed.
var BrokerRestart = Scenario{
	Name:        "broker-restart",
	Replicas:    1,
	WholeBroker: true,
	Fault: func(s *Stack, busy func() bool) {
		underLoad(s, busy, 2, func() time.Duration { return 3 * time.Second }, func() bool {
			s.Broker().Stop(4 * time.Second)
			return true
		})
		s.Note("RabbitMQ stopped for 4 s and started again %d times under load", s.UnderLoad)
	},
	Check: func(t testing.TB, s *Stack) { checkReconnected(t, s, "broker restarts", 2) },
}

// BrokerStopOutboxBacklog is the broker-stop-outbox-backlog scenario, for a
// service that emits events: its outbox has a backlog when RabbitMQ goes
// away for 20 s. The replica is held while the load fills its queue; a
// memory alarm then blocks every publishing connection, so that when the
// replica starts again it applies the queued messages (its acks travel on
// a connection that does not publish) while its relay cannot publish: the
// events pile up in the outbox. Then the broker stops, starts again, the
// alarm clears, and the relay drains the outbox. Nothing may be parked for
// the broker's absence: it spends no attempt.
func BrokerStopOutboxBacklog(backlog int) Scenario {
	return Scenario{
		Name:        "broker-stop-outbox-backlog",
		Replicas:    1,
		WholeBroker: true,
		FixedLoad:   true,
		Fault: func(s *Stack, busy func() bool) {
			s.Hold(0)
			s.SuperviseWhile(5*time.Minute, "publishing the load", busy)
			s.Broker().MemoryAlarm()
			s.Release(0)
			n := 0
			testenv.Eventually(s.t, 2*time.Minute, fmt.Sprintf("a backlog of %d events in the outbox", backlog), func() (bool, error) {
				n = s.view.outboxBacklog()
				return n >= backlog, nil
			})
			s.Broker().Stop(20 * time.Second)
			s.Broker().ClearMemoryAlarm()
			s.Note("the outbox held %d unsent events when RabbitMQ stopped for 20 s (a memory alarm had blocked the relay)", n)
			s.backlog = n
		},
		Check: func(t testing.TB, s *Stack) {
			if s.backlog < backlog {
				t.Errorf("the outbox held %d events when the broker stopped, want at least %d", s.backlog, backlog)
			}
			if n := testenv.Count(t, s.cfg.DBURL, `SELECT count(*) FROM outbox WHERE status = 'parked'`); n != 0 {
				t.Errorf("%d outbox events parked: the broker's absence must spend no attempt", n)
			}
		},
	}
}

// Action is one kind of fault a chaos run picks among: the kit's (a
// SIGKILL, the broker dropping connections, the database terminating
// sessions) and a service's own (its dependency's fault rates, say).
type Action struct {
	Name string
	// Do injects the fault and reports whether it did (a SIGKILL finds no
	// replica running, say: it did not happen, and does not count).
	Do func(s *Stack) bool
	// Reset undoes what Do left in place, once the chaos ends (nil: nothing).
	Reset func(s *Stack)
}

// The kit's chaos actions.
var (
	KillAction = Action{Name: "SIGKILL", Do: func(s *Stack) bool {
		i := s.KillRandom()
		s.t.Logf("chaos: SIGKILL replica %d", i)
		return i >= 0
	}}
	DropAction = Action{Name: "connections dropped", Do: func(s *Stack) bool {
		s.Broker().CloseConnections()
		s.t.Logf("chaos: the broker closed every connection of the vhost")
		return true
	}}
	DatabaseAction = Action{Name: "database sessions terminated", Do: func(s *Stack) bool {
		n := s.TerminateBackends()
		s.t.Logf("chaos: terminated %d sessions of the service's database", n)
		return n > 0
	}}
)

// Chaos is the chaos scenario: every fault at once for d. Two replicas run
// with the crash points of arms armed; every 2 to 5 s one action happens,
// in shuffled rounds of the kit's three and the service's extra, so that
// each kind happens as often as the others. An action may find nothing to
// do (no session of the database open at that moment, say): the chaos then
// goes on past d until every kind has happened at least once (until a
// minute before go test's -timeout at most, 10d without one), so that a
// slow machine, which fits fewer rounds in d, still gets each. Then
// the faults stop, the dead replicas start again and the trial drains and
// verifies as after any scenario. The trial's load goes on while the chaos
// does (Trial.LoadMore).
func Chaos(d time.Duration, arms []Arm, extra ...Action) Scenario {
	actions := append([]Action{KillAction, DropAction, DatabaseAction}, extra...)
	return Scenario{
		Name:     "chaos",
		Replicas: 2,
		Fault: func(s *Stack, busy func() bool) {
			s.ArmAll(arms...)
			ran := map[string]int{}
			var round []Action
			missing := func() bool {
				return slices.ContainsFunc(actions, func(a Action) bool { return ran[a.Name] == 0 })
			}
			began := time.Now()
			end, ok := testenv.TestDeadline(s.t)
			if !ok {
				end = began.Add(10 * d)
			}
			for time.Since(began) < d || (missing() && time.Now().Before(end)) {
				s.SuperviseFor(time.Duration(2000+rand.IntN(3000)) * time.Millisecond)
				if len(round) == 0 {
					round = slices.Clone(actions)
					rand.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
				}
				if round[0].Do(s) {
					ran[round[0].Name]++
				}
				round = round[1:]
			}
			s.ArmAll()
			for _, a := range actions {
				if a.Reset != nil {
					a.Reset(s)
				}
			}
			s.Supervise()
			s.chaosRan = ran
			s.Note("%s of chaos on two replicas, %d crash points armed: %d crashes, %d SIGKILLs, %d restarts", time.Since(began).Round(time.Second), len(arms), s.Crashes, s.Kills, s.Restarts)
			for _, a := range actions {
				s.Note("%s: %d times", a.Name, ran[a.Name])
			}
		},
		Check: func(t testing.TB, s *Stack) {
			if s.Restarts == 0 {
				t.Errorf("no replica died and was started again in %s of chaos", d)
			}
			for _, a := range actions {
				if s.chaosRan[a.Name] == 0 {
					t.Errorf("%s never happened in the chaos, which went on for it until a minute before the test's deadline", a.Name)
				}
			}
		},
	}
}
