package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/buffered"
	"github.com/inbox-template/payment-service/internal/database"
	"github.com/inbox-template/payment-service/internal/testenv"
)

// The failure table's broker and database rows with the buffered inbox on.
// The messages here have no ordering key (each is a key of its own), and the
// handler records one effect per message: assertAllAppliedOnce checks one
// effect and one inbox row per message and an empty dead-letter queue.

// Three times while the buffered ingest stores a 2000-message backlog (a
// transaction per message, so that it takes a while) the broker closes every
// connection: the ingest reconnects, never settles a delivery on the wrong
// channel, and the processing goes on from the table meanwhile.
func TestBufferedConnectionsClosedUnderLoad(t *testing.T) {
	e := newBufferedEnv(t, nil)
	const n = 2000
	e.publishMany(n, "load")
	since := brokerLog(t)
	rt := e.start(recordHandler(nil), func(c *Config) {
		bufferedMode(e.db, e.dbURL, nil)(c)
		c.Prefetch, c.GroupCommitMax, c.GroupCommitWait = 32, 1, 0
	})
	for _, at := range []int{400, 900, 1400} {
		waitFor(t, "ingest progress", func() bool { return rt.count(OutcomeStored) >= at })
		testenv.Ctl(t, "close_all_connections", "-p", e.vhost, "fault test: connections dropped")
	}
	e.assertAllAppliedOnce(n, 2*time.Minute)
	if rt.reconnects() < 3 {
		t.Errorf("%d reconnects, want at least 3", rt.reconnects())
	}
	assertOwnChannels(t, rt, since)
	t.Logf("reconnects %d, redeliveries suppressed %d", rt.reconnects(), rt.count(OutcomeDuplicate))
}

// PostgreSQL is unreachable for 15 s while events of 20 keys are stored and
// processed: the ingest leaves what it could not store unacked for the broker
// to take back in order, and pauses; the processing releases what it held
// and pauses; nothing is dead-lettered, parked or sent through a delay queue,
// and afterwards every key is applied once per event, in the order published.
func TestBufferedDatabaseOutagePausesAndLosesNothing(t *testing.T) {
	e := newBufferedEnv(t, nil)
	proxy := testenv.Proxy(t, "postgres", "127.0.0.1:5432")
	dbURL := proxiedURL(t, e.dbURL, proxy.Listen)
	db := openPool(t, dbURL, 2*time.Second)
	keys := keyNames(20)
	const perKey = 30
	e.publishEvents(keys, perKey)
	handler := orderedHandler(func(Message, event) error { time.Sleep(5 * time.Millisecond); return nil })
	rt := e.startWith(handler, e.url, db, func(c *Config) {
		bufferedMode(db, dbURL, func(b *BufferedConfig) { b.MaxAttempts = 2 })(c)
		c.MaxAttempts, c.GroupCommitMax, c.GroupCommitWait = 2, 1, 0
	})
	waitFor(t, "progress", func() bool { return e.appliedTotal() >= 50 })
	proxy.Stop()
	waitFor(t, "not ready during the outage", func() bool { return rt.Ready() != nil })
	time.Sleep(15 * time.Second)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "every event applied", func() (bool, error) {
		return e.appliedTotal() >= len(keys)*perKey, nil
	})
	e.assertInOrder(keys, perKey)
	if rt.pauses() < 1 || rt.count(OutcomeDeadLettered) != 0 || e.statusCount(buffered.StatusParked) != 0 {
		t.Errorf("pauses %d, dead letters %d, parked %d: want a pause and nothing dead-lettered or parked",
			rt.pauses(), rt.count(OutcomeDeadLettered), e.statusCount(buffered.StatusParked))
	}
}

// Backends are killed in the middle of ingest, claim and final transactions:
// each rolls back whole (or its lease expires), so nothing is lost and
// nothing applied twice.
func TestBufferedBackendsTerminatedMidTransaction(t *testing.T) {
	e := newBufferedEnv(t, nil)
	const n = 800
	e.publishMany(n, "kill")
	ctx := context.Background()
	db, err := database.Open(ctx, database.Options{URL: e.dbURL, MaxConns: 10, StatementTimeout: 5 * time.Second, AppName: "victim"}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	rt := e.startWith(slowHandler(3*time.Millisecond), e.url, db, func(c *Config) {
		bufferedMode(db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = 20 })(c)
		c.Workers, c.Prefetch, c.MaxAttempts, c.GroupCommitMax = 8, 16, 10, min(c.GroupCommitMax, 4)
	})
	killed := e.killVictimBackends(n)
	e.assertAllAppliedOnce(n, 2*time.Minute)
	if killed == 0 {
		t.Fatal("no backend was terminated: the test proved nothing")
	}
	t.Logf("terminated %d backends; retried %d, requeued %d, pauses %d", killed, rt.count(OutcomeRetried), rt.count(OutcomeRequeued), rt.pauses())
}

// PostgreSQL is unreachable when a claimed message's handler returns, for
// longer than its lease: its commit fails, and so does the release that
// would give its attempt back. The release is kept and done when the pause
// ends, before this replica claims again: the message succeeds on its next
// run with one attempt spent (and two runs: it may have called out).
func TestUnreachableDatabaseGivesTheAttemptBackAfterThePause(t *testing.T) {
	e := newBufferedEnv(t, nil)
	proxy := testenv.Proxy(t, "postgres", "127.0.0.1:5432")
	dbURL := proxiedURL(t, e.dbURL, proxy.Listen)
	db := openPool(t, dbURL, 2*time.Second)
	inHandler := make(chan struct{}, 1)
	resume := make(chan struct{})
	first := true
	handler := orderedHandler(func(Message, event) error {
		if first {
			first = false
			inHandler <- struct{}{}
			<-resume
		}
		return nil
	})
	e.startWith(handler, e.url, db, func(c *Config) {
		bufferedMode(db, dbURL, func(b *BufferedConfig) { b.Lease = 2 * time.Second })(c)
		c.Workers = 1
	})
	e.publishEvents([]string{"key-00"}, 1)
	<-inHandler
	proxy.Stop()
	close(resume) // the commit fails: the database is unreachable
	time.Sleep(6 * time.Second)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "applied", func() (bool, error) { return e.appliedTotal() >= 1, nil })
	var attempts, runs int
	if err := e.db.Raw(`SELECT attempts, runs FROM inbox_messages`).Row().Scan(&attempts, &runs); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || runs != 2 {
		t.Errorf("attempts %d, runs %d after one outage and one success, want 1 and 2: the outage spent an attempt", attempts, runs)
	}
}
