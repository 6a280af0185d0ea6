package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// From an outside review: each of these failed before its fix.

// A row whose publish makes the broker close the channel (an exchange that
// does not exist: 404) spends an attempt each time and is parked in the end;
// the rows behind it are published meanwhile. Before, the batch went back
// without an attempt and the same row closed the channel again, forever.
func TestRowTheBrokerClosesTheChannelOnIsParked(t *testing.T) {
	e := newEnv(t)
	if _, err := e.emit(nil, Message{Exchange: "not-declared", RoutingKey: key, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // older than the rest: first in every claim
	msgs := make([]Message, 20)
	for i := range msgs {
		msgs[i] = event(i, "")
	}
	if _, err := e.emit(nil, msgs...); err != nil {
		t.Fatal(err)
	}
	e.relay(e.amqp, nil)
	if got := e.received(20); len(got) != 20 {
		t.Fatalf("received %d of the 20 rows behind it", len(got))
	}
	eventually(t, "the row parked after its attempts, the rest sent", 30*time.Second, func() bool {
		return e.count("status = 'parked' AND exchange = 'not-declared' AND attempts = 3") == 1 && e.count("status = 'sent'") == 20
	})
	parked, err := e.store.ListParked(context.Background(), 1)
	if err != nil || len(parked) != 1 || parked[0].Reason != ReasonRefused {
		t.Fatalf("parked %+v (%v), want the row refused", parked, err)
	}
}

// Enqueue refuses an exchange the service does not publish to, instead of
// leaving a row the broker will refuse.
func TestEnqueueRefusesAnExchangeNotPublished(t *testing.T) {
	e := newEnv(t)
	e.outbox = New("producer", exchange)
	if _, err := e.emit(nil, Message{Exchange: "elsewhere", RoutingKey: key, Body: []byte(`{}`)}); err == nil {
		t.Fatal("Enqueue took an exchange the service does not publish to")
	}
	if _, err := e.emit(nil, event(1, ""), Message{Exchange: "", RoutingKey: queue, Body: []byte(`{}`)}); err != nil {
		t.Fatalf("Enqueue refused a declared exchange or the default one: %v", err)
	}
}

// An idle relay waits for its poll: its own NOTIFY, coming back to its
// LISTEN, no longer sends another (before: a claim and a NOTIFY every 50 ms).
func TestIdleRelayStaysIdle(t *testing.T) {
	e := newEnv(t)
	e.relay(e.amqp, func(c *RelayConfig) { c.PollInterval = 10 * time.Second })
	if _, err := e.emit(nil, event(1, "")); err != nil {
		t.Fatal(err)
	}
	e.received(1)
	testenv.Eventually(t, 30*time.Second, "marked sent", func() (bool, error) { return e.count("status = 'sent'") == 1, nil })
	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	commits := func() int64 {
		var n int64
		if err := sqlDB.QueryRow(`SELECT pg_stat_clear_snapshot()`).Scan(new(any)); err != nil {
			t.Fatal(err)
		}
		if err := sqlDB.QueryRow(`SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := commits()
	time.Sleep(5 * time.Second)
	n := commits() - before
	t.Logf("idle relay (poll 10s): %d transactions in 5 s", n)
	// About a dozen here (the gauges, the test's own reads), plus up to a
	// second's worth of the test's polls above whose statistics PostgreSQL
	// had not flushed yet (about 20); a relay that wakes itself runs a
	// claim and a NOTIFY every 50 ms, a hundred of each in 5 s.
	if n > 50 {
		t.Errorf("%d transactions in 5 s of an idle relay: it wakes itself", n)
	}
}

// A backlog of one ordering key drains at once: marking a head sent makes
// its successor due and the relay claims again, with no wake-up from
// anywhere (before: one row per poll interval).
func TestHotKeyBacklogDrainsWithoutWakeUps(t *testing.T) {
	e := newEnv(t)
	const n = 10
	for i := range n {
		if _, err := e.emit(nil, event(i, "hot")); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	e.relay(e.amqp, func(c *RelayConfig) { c.PollInterval = time.Minute; c.ListenURL = "" })
	got := e.received(n)
	t.Logf("%d rows of one key in %s", len(got), time.Since(began).Round(time.Millisecond))
	// A row per poll interval would take 9 minutes, one wait for a poll a
	// minute; a busy machine, seconds.
	if time.Since(began) > 30*time.Second {
		t.Errorf("the key's rows waited for the poll interval")
	}
}

// A transaction that enqueues to two keys in two calls (the group commit
// calls Enqueue once per message) locks them in the order of its calls,
// MarkSent in key order: a deadlock, which PostgreSQL breaks by aborting one
// side. The mark is done again at once, and both sides succeed.
func TestMarkSentSurvivesADeadlockWithEnqueue(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.emit(nil, event(1, "a"), event(2, "b")); err != nil {
		t.Fatal(err)
	}
	claimed, _, err := e.store.Claim(ctx, 10, 30*time.Second)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d rows, %v", len(claimed), err)
	}
	tx := e.db.Begin()
	defer tx.Rollback()
	if _, err := e.outbox.Enqueue(ctx, tx, event(5, "b")); err != nil {
		t.Fatal(err)
	}
	r := &Relay{store: e.store, log: e.logger()}
	var wg sync.WaitGroup
	var markErr error
	wg.Go(func() { _, _, markErr = r.markSent(ctx, claimed) })
	e.waitLockWaiters(1) // the mark holds "a" and waits for "b"
	_, enqErr := e.outbox.Enqueue(ctx, tx, event(6, "a"))
	if enqErr == nil {
		enqErr = tx.Commit().Error
	}
	wg.Wait()
	if markErr != nil {
		t.Errorf("mark sent: %v", markErr)
	}
	t.Logf("enqueue: %v (a loser is put back by the runtime without spending an attempt)", enqErr)
}

// Enqueue locks one call's keys in Go's byte order; the mark must lock them
// in the same order, whatever the column's collation: in a database that is
// not C (the postgres image: en_US.utf8) "B" < "a" in bytes but "a" < "B" in
// en-US, and one Enqueue call with both keys deadlocked against the mark.
func TestMarkLocksKeysInEnqueuesOrderUnderAnyCollation(t *testing.T) {
	for _, collate := range []string{"", "en-US-x-icu"} {
		t.Run("collate="+collate, func(t *testing.T) {
			if err := markAgainstOneEnqueueCall(t, collate); err != nil {
				t.Fatalf("one Enqueue call deadlocked against the mark: %v", err)
			}
		})
	}
}

// markAgainstOneEnqueueCall lines up a mark of keys "B" and "a" and one
// Enqueue call to both behind a lock on "a", and returns a deadlock error of
// either. collate, if set, is the ordering_key column's collation.
func markAgainstOneEnqueueCall(t *testing.T, collate string) error {
	e := newEnv(t)
	ctx := context.Background()
	sqlDB, _ := e.db.DB()
	if collate != "" {
		if _, err := sqlDB.Exec(`ALTER TABLE outbox_keys ALTER COLUMN ordering_key TYPE text COLLATE "` + collate + `"`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.emit(nil, event(1, "B"), event(2, "a")); err != nil {
		t.Fatal(err)
	}
	claimed, _, err := e.store.Claim(ctx, 10, 30*time.Second)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	// X holds "a" so that the mark and the enqueue line up behind it.
	x, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Exec(`SELECT 1 FROM outbox_keys WHERE ordering_key = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var markErr, enqErr error
	wg.Go(func() { _, _, markErr = e.store.MarkSent(ctx, claimed) })
	e.waitLockWaiters(1)
	tx := e.db.Begin()
	defer tx.Rollback()
	wg.Go(func() {
		if _, enqErr = e.outbox.Enqueue(ctx, tx, event(3, "B"), event(4, "a")); enqErr == nil {
			enqErr = tx.Commit().Error
		}
	})
	e.waitLockWaiters(2)
	_ = x.Commit()
	wg.Wait()
	t.Logf("collate %q: mark: %v; enqueue: %v", collate, markErr, enqErr)
	for _, err := range []error{markErr, enqErr} {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "40P01" {
			return err
		}
	}
	return nil
}

// Enqueue numbers the messages of each ordering key in the call's order,
// after the key's last, in one statement; only a key's head is due now, and
// the ids it returns are the rows', in the order of msgs.
func TestEnqueueNumbersEachKeyInTheCallsOrder(t *testing.T) {
	e := newEnv(t)
	first, err := e.emit(nil, event(1, "a"), event(2, ""), event(3, "b"), event(4, "a"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.emit(nil, event(5, "b"), event(6, "a"), event(7, "a"))
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Body        string
		OrderingKey *string
		Seq         *int64
		Due         bool
	}
	got := map[string]row{}
	rows, err := e.db.Raw(`SELECT id::text, convert_from(body, 'UTF8'), ordering_key, seq, available_at <= now() FROM outbox`).Rows()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.Body, &r.OrderingKey, &r.Seq, &r.Due); err != nil {
			t.Fatal(err)
		}
		got[id] = r
	}
	want := []struct {
		n   int
		key string
		seq int64 // 0: unordered
		due bool
	}{{1, "a", 1, true}, {2, "", 0, true}, {3, "b", 1, true}, {4, "a", 2, false}, {5, "b", 2, false}, {6, "a", 3, false}, {7, "a", 4, false}}
	for i, id := range append(first, second...) {
		w, r := want[i], got[id]
		if !strings.Contains(r.Body, fmt.Sprintf(`"n":%d,`, w.n)) {
			t.Fatalf("id %d of the calls is the row of %s, want event %d", i, r.Body, w.n)
		}
		seq := int64(0)
		if r.Seq != nil {
			seq = *r.Seq
		}
		if seq != w.seq || r.Due != w.due || (r.OrderingKey == nil) != (w.key == "") {
			t.Errorf("event %d: seq %d, due %v, key %v; want seq %d, due %v, key %q", w.n, seq, r.Due, r.OrderingKey, w.seq, w.due, w.key)
		}
	}
	var last int64
	if err := e.db.Raw(`SELECT last_seq FROM outbox_keys WHERE ordering_key = 'a'`).Scan(&last).Error; err != nil || last != 4 {
		t.Errorf("key a: last_seq %d (%v), want 4", last, err)
	}
}

// waitLockWaiters waits until n of the database's sessions wait for a lock.
func (e *env) waitLockWaiters(n int) {
	e.t.Helper()
	testenv.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d sessions waiting for a lock", n), func() (bool, error) {
		var got int
		err := e.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Row().Scan(&got)
		return got >= n, err
	})
}
