package consumer

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

func slowHandler(d time.Duration) Handler {
	return recordHandler(func(Message) error { time.Sleep(d); return nil })
}

func (r *runtime) reconnects() int {
	return counterValue(r.metrics.reconnects.WithLabelValues(r.cfg.Name))
}

// pauses counts the pauses of every cause.
func (r *runtime) pauses() int {
	ch := make(chan prometheus.Metric, 16)
	go func() { r.metrics.pauses.Collect(ch); close(ch) }()
	n := 0
	for m := range ch {
		n += counterValue(m)
	}
	return n
}

// brokerLog returns what RabbitMQ logged from now on, read when called.
func brokerLog(t *testing.T) func() string {
	path := os.Getenv("TEST_RABBITMQ_LOG")
	if path == "" {
		logs, _ := filepath.Glob("/var/log/rabbitmq/rabbit@*.log")
		for _, l := range logs {
			if !strings.HasSuffix(l, "_upgrade.log") {
				path = l
			}
		}
	}
	start, err := os.Stat(path)
	if err != nil {
		t.Logf("broker log %s not readable (%v): checking the service's log only", path, err)
		return func() string { return "" }
	}
	return func() string {
		b, err := os.ReadFile(path)
		if err != nil || int64(len(b)) < start.Size() {
			return ""
		}
		return string(b[start.Size():])
	}
}

// Three times during a 2000-message stream the broker closes every connection
// of the vhost. Deliveries of a dead channel are never settled on a new one, so
// the broker never sees an unknown delivery tag, and every message is applied
// once. The buffered mode stores with a transaction per message, so that its
// ingest takes a while, and processes from the table meanwhile.
func TestConnectionsClosedUnderLoad(t *testing.T) {
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		const n = 2000
		e.publishMany(n, "load")
		since := brokerLog(t)
		rt := e.start(recordHandler(nil), func(c *Config) {
			m.config(e.db, e.dbURL, nil)(c)
			if m.buffered() {
				c.Prefetch, c.GroupCommitMax, c.GroupCommitWait = 32, 1, 0
			} else {
				c.Workers, c.Prefetch = 8, 32
			}
		})
		for i, at := range []int{400, 900, 1400} {
			// Each close hits a live session: a fast consumer may pass the
			// next mark while rabbitmqctl still runs, and a close during
			// the reconnect's backoff would find no connection to close.
			waitFor(t, "progress on a live session", func() bool {
				return m.taken(e, rt) >= at && rt.reconnects() == i && rt.Ready() == nil
			})
			testenv.CloseConnections(t, e.vhost, "fault test: connections dropped")
		}
		e.assertAllAppliedOnce(n, 2*time.Minute)
		if rt.reconnects() < 3 {
			t.Errorf("%d reconnects, want at least 3", rt.reconnects())
		}
		assertOwnChannels(t, rt, since)
		t.Logf("reconnects %d, duplicates suppressed %d", rt.reconnects(), rt.count(OutcomeDuplicate))
	})
}

// assertOwnChannels checks that neither the service's log nor the broker's
// since the test began shows a delivery settled on the wrong channel.
func assertOwnChannels(t *testing.T, rt *runtime, since func() string) {
	t.Helper()
	for name, log := range map[string]string{"service": rt.logs.String(), "broker": since()} {
		if strings.Contains(log, "unknown delivery tag") || strings.Contains(log, "PRECONDITION_FAILED") {
			t.Errorf("the %s log shows a delivery settled on the wrong channel", name)
		}
	}
}

// killVictimBackends terminates the active and idle-in-transaction sessions
// of the pool named victim every 150 ms until it terminated at least five
// or the n messages are applied, whichever comes first, and returns how
// many it terminated: on a loaded machine it goes on as long as the load
// lasts, not for a number of rounds.
func (e *env) killVictimBackends(n int) int {
	e.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close(ctx)
	killed := 0
	for killed < 5 {
		if _, d := e.applied(); d == n {
			break
		}
		var k int
		err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'victim' AND state IN ('active', 'idle in transaction')`).Scan(&k)
		if err != nil {
			e.t.Fatal(err)
		}
		killed += k
		time.Sleep(150 * time.Millisecond)
	}
	return killed
}

// openPool opens a pool of the test's database at url (the database's own, or
// through a proxy), closed when the test ends.
func openPool(t *testing.T, url string, statementTimeout time.Duration) *gorm.DB {
	t.Helper()
	db, err := database.Open(context.Background(), database.Options{
		URL: url, MaxConns: 10, StatementTimeout: statementTimeout, AppName: t.Name(),
	}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	return db
}

// proxiedURL points rawURL at a proxy's listen address.
func proxiedURL(t *testing.T, rawURL, listen string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = listen
	return u.String()
}

// The AMQP link goes silent (a blackhole, not a reset): heartbeats detect it,
// the runtime reconnects once the link is back, and nothing is lost or doubled.
func TestBlackholedBrokerLinkIsDetectedByHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := testenv.Proxy(t, "amqp", "127.0.0.1:5672")
	const n = 300
	e.publishMany(n, "bh")
	rt := e.startWith(slowHandler(5*time.Millisecond), proxiedURL(t, e.url, proxy.Listen), e.db,
		func(c *Config) { c.Heartbeat = time.Second })
	waitFor(t, "progress", func() bool { _, d := e.applied(); return d >= 50 })
	for _, stream := range []string{"upstream", "downstream"} {
		testenv.AddToxic(t, proxy, `{"name":"blackhole-`+stream+`","type":"timeout","stream":"`+stream+`","attributes":{"timeout":0}}`)
	}
	waitFor(t, "the silent link to be detected", func() bool { return rt.Ready() != nil })
	for _, stream := range []string{"upstream", "downstream"} {
		testenv.RemoveToxic(t, proxy, "blackhole-"+stream)
	}
	e.assertAllAppliedOnce(n, 2*time.Minute)
	if rt.reconnects() < 1 {
		t.Error("no reconnect after the blackhole")
	}
}

// PostgreSQL is unreachable for 20 s while events of 20 keys are applied:
// the runtime pauses instead of spending retry budgets (the buffered ingest
// leaves what it could not store unacked for the broker to take back in
// order, its processing releases what it held), stays unready throughout,
// and resumes by itself; nothing is dead-lettered, parked or applied twice,
// and in the buffered mode every key is applied in the order published.
func TestDatabaseOutagePausesAndLosesNothing(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		proxy := testenv.Proxy(t, "postgres", "127.0.0.1:5432")
		dbURL := proxiedURL(t, e.dbURL, proxy.Listen)
		db := openPool(t, dbURL, 2*time.Second)
		keys := keyNames(20)
		const perKey = 20
		e.publishEvents(keys, perKey)
		handler := orderedHandler(func(Message, event) error { time.Sleep(3 * time.Millisecond); return nil })
		var refused atomic.Int32
		rt := e.startWith(handler, e.url, db, func(c *Config) {
			m.config(db, dbURL, func(b *BufferedConfig) { b.MaxAttempts = 2 })(c)
			c.MaxAttempts = 2
			check := c.DatabaseCheck
			c.DatabaseCheck = func(ctx context.Context) error {
				err := check(ctx)
				if err != nil {
					refused.Add(1)
				}
				return err
			}
			if m.buffered() {
				c.GroupCommitMax, c.GroupCommitWait = 1, 0
			}
		})
		waitFor(t, "progress", func() bool { return e.appliedTotal() >= 50 })
		proxy.Stop()
		waitFor(t, "not ready during the outage", func() bool { return rt.Ready() != nil })
		// The outage outlasts five checks of the database (MaxAttempts is 2).
		testenv.Eventually(t, 2*time.Minute, "five checks refused", func() (bool, error) { return refused.Load() >= 5, nil })
		if rt.Ready() == nil {
			t.Error("ready while the database is unreachable")
		}
		if err := proxy.Start(); err != nil {
			t.Fatal(err)
		}
		e.waitApplied(t, len(keys)*perKey)
		m.assertEventsApplied(e, keys, perKey)
		if rt.pauses() < 1 || rt.count(OutcomeDeadLettered) != 0 {
			t.Errorf("pauses %d, dead letters %d: want a pause and no dead letter", rt.pauses(), rt.count(OutcomeDeadLettered))
		}
	})
}

// Backends are killed in the middle of the runtime's transactions (inline:
// the inbox transactions; buffered: ingest, claim and final ones): each rolls
// back whole (or its lease expires), so no inbox row exists without its
// effect, nothing is lost and nothing applied twice.
func TestBackendsTerminatedMidTransaction(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		const n = 800
		e.publishMany(n, "kill")
		ctx := context.Background()
		// The runtime gets a pool of its own, and only its backends are killed: the
		// test's own reads must not be hit.
		db, err := database.Open(ctx, database.Options{URL: e.dbURL, MaxConns: 10, StatementTimeout: 5 * time.Second, AppName: "victim"}, testenv.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = database.Close(db) })
		rt := e.startWith(slowHandler(3*time.Millisecond), e.url, db, func(c *Config) {
			m.config(db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = 20 })(c)
			c.Workers, c.Prefetch, c.MaxAttempts = 8, 16, 10
			if m.buffered() {
				c.GroupCommitMax = min(c.GroupCommitMax, 4)
			}
		})
		killed := e.killVictimBackends(n)
		e.assertAllAppliedOnce(n, 2*time.Minute)
		if killed == 0 {
			t.Fatal("no backend was terminated: the test proved nothing")
		}
		t.Logf("terminated %d backends; retried %d, requeued %d, pauses %d", killed, rt.count(OutcomeRetried), rt.count(OutcomeRequeued), rt.pauses())
	})
}

// PostgreSQL goes silent (a blackhole, not a refusal): no worker hangs until
// TCP gives up; the transaction deadline and the ping find the outage, the
// runtime pauses, and everything is applied once after the link is back.
func TestBlackholedDatabaseDoesNotWedgeWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := testenv.Proxy(t, "postgres", "127.0.0.1:5432")
	db := openPool(t, proxiedURL(t, e.dbURL, proxy.Listen), 2*time.Second)
	const n = 200
	e.publishMany(n, "silent")
	rt := e.startWith(slowHandler(5*time.Millisecond), e.url, db, func(c *Config) { c.MaxAttempts = 2 })
	waitFor(t, "progress", func() bool { _, d := e.applied(); return d >= 30 })
	for _, stream := range []string{"upstream", "downstream"} {
		testenv.AddToxic(t, proxy, `{"name":"silent-`+stream+`","type":"timeout","stream":"`+stream+`","attributes":{"timeout":0}}`)
	}
	testenv.Eventually(t, time.Minute, "the pause", func() (bool, error) { return rt.pauses() >= 1, nil })
	for _, stream := range []string{"upstream", "downstream"} {
		testenv.RemoveToxic(t, proxy, "silent-"+stream)
	}
	proxy.Stop() // cut the connections that saw the blackhole, as a real network reset would
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	e.assertAllAppliedOnce(n, 2*time.Minute)
}

// The database answers but cannot write (read-only, as a standby after a
// failover): messages are put back without spending attempts, the runtime
// pauses until the database takes writes again, and nothing is dead-lettered.
func TestReadOnlyDatabasePausesAndLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	db, err := database.Open(ctx, database.Options{URL: e.dbURL, MaxConns: 10, StatementTimeout: 2 * time.Second, AppName: "victim"}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	checker, err := database.NewChecker(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = checker.Close() })
	admin, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	setReadOnly := func(on string) {
		t.Helper()
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+dbName+" SET default_transaction_read_only = "+on); err != nil {
			t.Fatal(err)
		}
		if on == "on" {
			// The pool's sessions keep the setting they started with: end
			// them, so that the new ones are read-only, as after a failover.
			// Turning it off again ends none: the runtime must renew the
			// read-only sessions by itself.
			if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'victim' AND datname = $1`, dbName); err != nil {
				t.Fatal(err)
			}
		}
	}
	const n = 200
	e.publishMany(n, "ro")
	var resets, refused atomic.Int32
	rt := e.startWith(slowHandler(2*time.Millisecond), e.url, db, func(c *Config) {
		c.MaxAttempts = 2
		c.ReconnectMaxWait = 500 * time.Millisecond
		c.DatabaseCheck = func(ctx context.Context) error {
			err := checker.Check(ctx)
			if err != nil {
				refused.Add(1)
			}
			return err
		}
		c.ResetDatabase = func() { resets.Add(1); database.Recycle(db) }
	})
	waitFor(t, "progress", func() bool { _, d := e.applied(); return d >= 30 })
	setReadOnly("on")
	waitFor(t, "paused for the database", func() bool {
		err := rt.Ready()
		return err != nil && rt.pauses() >= 1
	})
	testenv.Eventually(t, time.Minute, "three checks refused while read-only", func() (bool, error) { return refused.Load() >= 3, nil })
	setReadOnly("off")
	e.assertAllAppliedOnce(n, 2*time.Minute)
	if rt.count(OutcomeDeadLettered) != 0 || rt.count(OutcomeRetried) != 0 {
		t.Errorf("dead-lettered %d, retried %d: a read-only database is not the messages' fault",
			rt.count(OutcomeDeadLettered), rt.count(OutcomeRetried))
	}
	if resets.Load() == 0 {
		t.Error("the pool's read-only sessions were not renewed when the pause ended")
	}
	t.Logf("pauses %d, requeued %d", rt.pauses(), rt.count(OutcomeRequeued))
}

// Prefetched deliveries that no worker started go back at every graceful stop.
// Left to the channel's close, a quorum queue counts each return against its
// x-delivery-limit and finally dead-letters valid messages that never failed;
// the runtime returns them as new messages instead. 30 restarts against a
// backlog with a limit of 2: nothing dead-lettered.
func TestGracefulRestartsDoNotSpendTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(topo *rabbit.Topology) { topo.DeliveryLimit = 2 })
	const n = 600
	e.publishMany(n, "r")
	for i := range 30 {
		rt := e.start(slowHandler(20*time.Millisecond), func(c *Config) { c.Workers = 2; c.Prefetch = 32 })
		time.Sleep(time.Duration(50+10*i%70) * time.Millisecond)
		rt.shutdown(t)
	}
	e.start(recordHandler(nil), nil)
	e.assertAllAppliedOnce(n, 2*time.Minute)
}

// PostgreSQL goes away after the runtime's inbox look-up, and the handler's
// own read (the payment handler reads payments before it charges) is the
// first to see it: a dropped connection is not the message's failure, in
// either mode. The message is put back without spending its only attempt,
// the runtime pauses, and it is applied once the database is back.
func TestDatabaseOutageSeenFirstByTheHandlerSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"inline", "buffered"} {
		t.Run(mode, func(t *testing.T) {
			e := newBufferedEnv(t, nil)
			proxy := testenv.Proxy(t, "postgres", "127.0.0.1:5432")
			dbURL := proxiedURL(t, e.dbURL, proxy.Listen)
			db := openPool(t, dbURL, 2*time.Second)
			inHandler := make(chan struct{}, 1)
			resume := make(chan struct{})
			var first atomic.Bool
			first.Store(true)
			handler := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
				if first.CompareAndSwap(true, false) {
					inHandler <- struct{}{}
					<-resume
				}
				if err := db.WithContext(ctx).Exec(`SELECT count(*) FROM effects`).Error; err != nil {
					return nil, fmt.Errorf("read effects: %w", err)
				}
				return recordWrites(msg), nil
			})
			rt := e.startWith(handler, e.url, db, func(c *Config) {
				c.Workers, c.MaxAttempts = 1, 1
				if mode == "buffered" {
					withBuffered(db, dbURL, func(b *BufferedConfig) { b.MaxAttempts = 1 })(c)
				}
			})
			e.publish("read-fails", `{"key":"k","n":1}`)
			<-inHandler
			proxy.Stop()
			close(resume)
			testenv.Eventually(t, 30*time.Second, "the pause", func() (bool, error) { return rt.pauses() >= 1, nil })
			if err := proxy.Start(); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, "applied", func() (bool, error) { return e.effects("read-fails") == 1, nil })
			if n := rt.count(OutcomeDeadLettered) + rt.count(OutcomeParked); n != 0 {
				t.Errorf("%d dead-lettered or parked: the outage spent the message's attempt", n)
			}
		})
	}
}

// One message failing on its own is not a dependency down for every message:
// the run of failures that pauses counts distinct messages, and a message's
// own budget is decided first. With PAUSE_AFTER_FAILURES equal to the
// attempts, the message is dead-lettered (parked) after its attempts, with no
// pause, instead of tripping the pause on its last attempt, being put back,
// and calling out again every cycle.
func TestOneMessageFailingAloneSpendsItsBudgetWithoutPausing(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"inline", "buffered"} {
		t.Run(mode, func(t *testing.T) {
			e := newBufferedEnv(t, nil)
			var runs atomic.Int64
			failing := HandlerFunc(func(context.Context, Message) (Writes, error) {
				runs.Add(1)
				return nil, errTransient
			})
			rt := e.start(failing, func(c *Config) {
				c.MaxAttempts, c.PauseAfterFailures = 3, 3
				if mode == "buffered" {
					withBuffered(e.db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = 3 })(c)
				}
			})
			e.publish("alone", `{"key":"k","n":1}`)
			testenv.Eventually(t, 30*time.Second, "its budget spent", func() (bool, error) {
				return rt.count(OutcomeDeadLettered)+rt.count(OutcomeParked) == 1, nil
			})
			if rt.pauses() != 0 || runs.Load() != 3 || rt.count(OutcomeRequeued) != 0 {
				t.Errorf("%d pauses, %d runs, %d put back: want no pause and three runs", rt.pauses(), runs.Load(), rt.count(OutcomeRequeued))
			}
		})
	}
}
