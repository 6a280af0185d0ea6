//go:build cluster

package consumer

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// On a three-node cluster, the node the consumer is connected to (which
// also leads the work queue: the queues were declared through it) is
// killed while the workers hold deliveries. The runtime reconnects to
// another node within its backoff, the new leader redelivers what was not
// acked, and every message is applied once. The acks of the held
// deliveries fail on their dead channel: one settled on the new channel
// would make the broker close it (PRECONDITION_FAILED, unknown delivery
// tag), which the log would show.
func TestConsumerFailsOverToAnotherClusterNode(t *testing.T) {
	c := testenv.NewCluster(t)
	e := newEnvOn(t, c.URL(), c.VHost(), nil)
	if n := c.Members(e.topo.Queue); n != 3 {
		t.Fatalf("the work queue has %d replicas, want 3", n)
	}
	held := make(chan struct{})
	var holding atomic.Int32
	h := recordHandler(func(msg Message) error {
		if strings.HasPrefix(msg.ID, "before-") && holding.Add(1) <= 4 {
			<-held // the node dies meanwhile
		}
		return nil
	})
	r := e.start(h, nil)
	node := r.node.Last()
	e.publishMany(40, "before")
	testenv.Eventually(t, 30*time.Second, "four deliveries held by the workers", func() (bool, error) {
		return holding.Load() >= 4, nil
	})
	killed := 0
	for n := 1; n <= 3; n++ {
		if c.NodeURL(n) != "" && strings.Contains(c.NodeURL(n), node) {
			killed = n
		}
	}
	if killed == 0 {
		t.Fatalf("the consumer's node %s is none of the cluster's: %s", node, c.URL())
	}
	if leader := c.Leader(e.topo.Queue); leader != killed {
		t.Fatalf("node %d leads the work queue, not the consumer's node %d: the kill would test no leader change", leader, killed)
	}
	c.Kill(killed)
	close(held) // their commits and acks come after the node died
	testenv.Eventually(t, time.Minute, "consuming through another node", func() (bool, error) {
		return r.Ready() == nil && testutil.ToFloat64(r.metrics.failovers.WithLabelValues(r.cfg.Name)) == 1, nil
	})
	e.publishMany(40, "after")
	for _, prefix := range []string{"before", "after"} {
		for i := range 40 {
			id := fmt.Sprintf("%s-%d", prefix, i)
			testenv.Eventually(t, time.Minute, id+" applied", func() (bool, error) { return e.effects(id) > 0, nil })
			if n := e.effects(id); n != 1 {
				t.Errorf("%s applied %d times", id, n)
			}
		}
	}
	c.Start(killed)
	logs := r.logs.String()
	if strings.Contains(logs, "unknown delivery tag") {
		t.Errorf("a stale delivery tag was settled on a new channel:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"broker failover: this session is on another node"`) {
		t.Errorf("no failover logged:\n%s", logs)
	}
	if n := r.count(OutcomeDuplicate); n == 0 {
		t.Error("no held delivery came back as a duplicate: their acks cannot have reached the dead node")
	}
	if n := e.queueDepth(e.topo.DeadLetterQueue); n != 0 {
		t.Errorf("%d messages dead-lettered", n)
	}
	t.Logf("killed node %d (%s); reconnects %v", killed, node, testutil.ToFloat64(r.metrics.reconnects.WithLabelValues(r.cfg.Name)))
}

// The buffered ingest keeps each key's order across the loss of the node
// that leads the work queue (and holds both replicas' connections): two
// replicas under a single active consumer store a backlog of 40 keys × 100
// events; the leader is killed while they store. The new leader
// gives the unacked deliveries back in the queue's order before the next
// consumer gets any, and every key's events are applied once, in order.
func TestBufferedKeepsOrderAcrossALeaderLoss(t *testing.T) {
	c := testenv.NewCluster(t)
	e := withBufferedTables(t, newEnvOn(t, c.URL(), c.VHost(), singleActive))
	keys := keyNames(40)
	const perKey = 100
	e.publishEvents(keys, perKey)
	tune := func(cfg *Config) {
		withBuffered(e.db, e.dbURL, nil)(cfg)
		cfg.Prefetch, cfg.Workers, cfg.GroupCommitMax, cfg.GroupCommitWait = 50, 4, 4, 0
	}
	// The leader first: finding it takes the CLI seconds, in which the
	// replicas could store the whole backlog. It does not move without a
	// fault.
	leader := c.Leader(e.topo.Queue)
	if leader == 0 {
		t.Fatal("the work queue has no leader")
	}
	a := e.start(orderedHandler(nil), tune)
	b := e.start(orderedHandler(nil), tune)
	waitFor(t, "a replica storing", func() bool { return a.count(OutcomeStored)+b.count(OutcomeStored) >= 50 })
	c.Kill(leader)
	if stored := a.count(OutcomeStored) + b.count(OutcomeStored); stored >= len(keys)*perKey {
		t.Fatalf("the replicas had stored all %d events before the kill: make the backlog bigger", stored)
	}
	e.waitApplied(t, len(keys)*perKey)
	c.Start(leader)
	e.assertInOrder(keys, perKey)
	failovers := testutil.ToFloat64(a.metrics.failovers.WithLabelValues(a.cfg.Name)) + testutil.ToFloat64(b.metrics.failovers.WithLabelValues(b.cfg.Name))
	if failovers == 0 {
		t.Error("no replica failed over: the killed node held none of their connections")
	}
	if n := e.queueDepth(e.topo.DeadLetterQueue); n != 0 {
		t.Errorf("%d messages dead-lettered", n)
	}
	t.Logf("killed node %d, the leader; stored %d + %d (duplicates %d), failovers %v", leader, a.count(OutcomeStored), b.count(OutcomeStored),
		a.count(OutcomeDuplicate)+b.count(OutcomeDuplicate), failovers)
}
