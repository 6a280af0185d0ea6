package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Environment of a replica process started from the test binary.
const (
	replicaAMQPEnv     = "BUFFERED_REPLICA_AMQP_URL"
	replicaDBEnv       = "BUFFERED_REPLICA_DATABASE_URL"
	replicaTopologyEnv = "BUFFERED_REPLICA_TOPOLOGY"
)

// TestBufferedReplicaProcess is not a test of its own: it is the replica
// process that TestBufferedOrderAcrossKilledReplicas starts (the test binary
// again) and kills. Run alone, it skips.
func TestBufferedReplicaProcess(t *testing.T) {
	t.Parallel()
	amqpURL := os.Getenv(replicaAMQPEnv)
	if amqpURL == "" {
		t.Skip("the replica process of TestBufferedOrderAcrossKilledReplicas")
	}
	var topo rabbit.Topology
	if err := json.Unmarshal([]byte(os.Getenv(replicaTopologyEnv)), &topo); err != nil {
		t.Fatal(err)
	}
	dbURL := os.Getenv(replicaDBEnv)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db, err := database.Open(ctx, database.Options{URL: dbURL, MaxConns: 8, StatementTimeout: 5 * time.Second, AppName: "replica"}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer database.Close(db)
	handler := orderedHandler(func(Message, event) error {
		time.Sleep(time.Duration(rand.IntN(4)) * time.Millisecond)
		if rand.Float64() < 0.1 {
			return errTransient
		}
		return nil
	})
	cfg := Config{
		Name: "test", AMQPURL: amqpURL, Heartbeat: 2 * time.Second, Topology: topo,
		Prefetch: 16, Workers: 4, MaxAttempts: 3, ShutdownTimeout: 5 * time.Second, ReconnectMaxWait: time.Second,
		DatabaseCheck: func(ctx context.Context) error { return database.Ping(ctx, db) },
	}
	cfg.GroupCommitMax, cfg.GroupCommitWait = testenv.GroupCommit()
	withBuffered(db, dbURL, func(b *BufferedConfig) { b.MaxAttempts = 100; b.Lease = 2 * time.Second })(&cfg)
	rt, err := New(cfg, inbox.New(db, cfg.Name), handler, time.Second, NewMetrics(prometheus.NewRegistry()), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// replica is a running replica process.
type replica struct {
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
}

func (e *env) startReplica(t *testing.T) *replica {
	t.Helper()
	topo, _ := json.Marshal(e.topo)
	r := &replica{out: &testenv.Buffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(os.Args[0], "-test.run=^TestBufferedReplicaProcess$", "-test.v")
	r.cmd.Env = append(os.Environ(), replicaAMQPEnv+"="+e.url, replicaDBEnv+"="+e.dbURL, replicaTopologyEnv+"="+string(topo))
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
	})
	return r
}

func (r *replica) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// Two replica processes, single active consumer (one ingests, both
// process), handlers failing at random, and one replica or the other
// SIGKILLed every second or so while events of 16 keys are published in
// order: every event is applied once, each key's in the order published.
// A kill lands anywhere: mid-ingest, between ingest commit and ack, mid-claim,
// mid-handler (its lease expires and another replica takes the message over),
// between the final commit and its status.
func TestBufferedOrderAcrossKilledReplicas(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, singleActive)
	keys := keyNames(16)
	replicas := []*replica{e.startReplica(t), e.startReplica(t)}
	ch := e.channel()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// The load goes on until the last kill: every kill finds it running.
	var publishing sync.WaitGroup
	var publishErr error
	var killing atomic.Bool
	killing.Store(true)
	perKey := 0
	publishing.Go(func() {
		for (perKey < 10 || killing.Load()) && publishErr == nil { // in bursts, so that kills find work in every stage
			publishErr = e.publishEventRange(ch, keys, perKey, perKey+5)
			perKey += 5
			time.Sleep(300 * time.Millisecond)
		}
	})
	const kills = 8
	for range kills {
		time.Sleep(time.Duration(600+rand.IntN(800)) * time.Millisecond)
		i := rand.IntN(len(replicas))
		replicas[i].kill()
		replicas[i] = e.startReplica(t)
	}
	killing.Store(false)
	publishing.Wait()
	if publishErr != nil {
		t.Fatal(publishErr)
	}
	e.waitApplied(t, len(keys)*perKey)
	// A late duplicate would come from the broker: wait until it holds
	// nothing ready or unacknowledged.
	testenv.Eventually(t, time.Minute, "the queue empty, nothing unacked, no stored message waiting", func() (bool, error) {
		ready, unacked := e.brokerHolds()
		var waiting int
		err := e.db.Raw(`SELECT count(*) FROM inbox_messages WHERE status IN ('pending', 'processing', 'failed')`).Row().Scan(&waiting)
		return ready == 0 && unacked == 0 && waiting == 0, err
	})
	e.assertInOrder(keys, perKey)
	if n := e.statusCount("parked"); n != 0 {
		t.Errorf("%d parked", n)
	}
	var attempts int
	if err := e.db.Raw(`SELECT coalesce(sum(attempts - 1), 0) FROM inbox_messages`).Row().Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d kills; %d runs beyond the first (random failures and runs cut short by a kill)", kills, attempts)
	if t.Failed() {
		for i, r := range replicas {
			t.Logf("--- replica %d:\n%s", i, r.out.String())
		}
	}
}

// publishEventRange publishes events from…to-1 of every key, interleaved,
// each with a confirm.
func (e *env) publishEventRange(ch *amqp.Channel, keys []string, from, to int) error {
	for n := from; n < to; n++ {
		for _, k := range keys {
			body, _ := json.Marshal(event{Key: k, N: n})
			err := rabbit.PublishConfirmed(context.Background(), ch, e.topo.Exchange, e.topo.RoutingKey, amqp.Publishing{
				MessageId: fmt.Sprintf("%s-%d", k, n), ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}
