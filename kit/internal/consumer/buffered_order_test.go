package consumer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// The buffered ingest keeps the broker's order through whatever ends its
// session: a graceful stop that hands the queue to another replica, a wait
// on a lock, a message the store refuses. (The database outage runs in
// both modes in faults_test.go.)

// A replica stopped gracefully while it ingests a backlog hands the queue to
// the next one (single active consumer) without storing anything out of
// order: it finishes its batch and closes its channel, so the broker takes
// back what it had not stored before the next replica gets any message.
func TestBufferedGracefulHandoverKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, singleActive)
	keys := keyNames(20)
	const perKey = 40
	e.publishEvents(keys, perKey)
	tune := func(c *Config) {
		withBuffered(e.db, e.dbURL, nil)(c)
		c.Prefetch, c.Workers, c.GroupCommitMax, c.GroupCommitWait = 200, 4, 4, 0
	}
	a := e.start(orderedHandler(nil), tune)
	b := e.start(orderedHandler(nil), tune)
	waitFor(t, "the first replica storing", func() bool { return a.count(OutcomeStored) >= 100 })
	a.shutdown(t)
	storedByA := a.count(OutcomeStored)
	e.waitApplied(t, len(keys)*perKey)
	e.assertInOrder(keys, perKey)
	if storedByA >= len(keys)*perKey || b.count(OutcomeStored) == 0 {
		t.Fatalf("a stored %d, b %d: the stop came too late to hand anything over", storedByA, b.count(OutcomeStored))
	}
	if n := a.count(OutcomeStored) + b.count(OutcomeStored); n != len(keys)*perKey {
		t.Errorf("stored %d in all, want %d", n, len(keys)*perKey)
	}
	t.Logf("a stored %d before its stop, b %d", storedByA, b.count(OutcomeStored))
}

// The ingest waits on a key's row that an operator's transaction holds past
// lock_timeout: nothing goes to a delay queue (its copy would be stored after
// later messages of its key). The batch is tried again in place, the
// deliveries after it waiting unacked in hand, and once the lock is gone
// every key is stored and applied in the order published, without a
// reconnect (which would cost each prefetched delivery a count against the
// queue's delivery limit).
func TestBufferedIngestLockWaitKeepsOrder(t *testing.T) {
	// Not parallel: its pool's 300 ms statement timeout (and lock timeout)
	// must be met by every other statement, which a busy machine may not.
	e := newBufferedEnv(t, nil)
	db := openPool(t, e.dbURL, 300*time.Millisecond)
	if err := e.db.Exec(`INSERT INTO inbox_keys (consumer, ordering_key, last_seq) VALUES ('test', 'key-00', 0)`).Error; err != nil {
		t.Fatal(err)
	}
	lock := e.db.Begin()
	if err := lock.Exec(`SELECT 1 FROM inbox_keys WHERE ordering_key = 'key-00' FOR UPDATE`).Error; err != nil {
		t.Fatal(err)
	}
	rt := e.startWith(orderedHandler(nil), e.url, db, func(c *Config) {
		withBuffered(db, e.dbURL, nil)(c)
		c.Prefetch = 50
	})
	keys := keyNames(3)
	e.publishEvents(keys, 10)
	waitFor(t, "the ingest trying a batch again after a lock wait", func() bool {
		return strings.Count(rt.logs.String(), "trying it again in place") >= 2
	})
	if err := lock.Commit().Error; err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "every event applied", func() (bool, error) { return e.appliedTotal() >= 30, nil })
	e.assertInOrder(keys, 10)
	// OutcomeRequeued: put in a delay queue by the ingest (the processing,
	// which would count a release there too, never waits on key-00's row:
	// nothing of key-00 is stored before the lock goes).
	if n := rt.count(OutcomeRequeued) + rt.count(OutcomeRetried) + rt.count(OutcomeDeadLettered); n != 0 {
		t.Errorf("%d messages rerouted through a delay queue or dead-lettered, want none", n)
	}
	if n := rt.reconnects(); n != 0 {
		t.Errorf("%d reconnects, want none: a lock wait of a few seconds is waited out in place", n)
	}
}

// A message whose data the store refuses (here a trigger of the cloner's; in
// life a header PostgreSQL cannot take) is dead-lettered at once, ingest_failed,
// and every other message is stored and applied in order, its own key going
// on without it.
func TestBufferedIngestRefusedMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	rt := e.startRefusing(`NEW.message_id = 'key-01-3'`, "22023")
	keys := keyNames(3)
	e.publishEvents(keys, 6)
	dl := e.deadLetters(1)
	if r := dl[0].Headers[wire.HeaderDeadLetterReason]; dl[0].MessageId != "key-01-3" || r != wire.ReasonIngestFailed {
		t.Fatalf("dead letter %s with reason %v, want key-01-3 with %s", dl[0].MessageId, r, wire.ReasonIngestFailed)
	}
	testenv.Eventually(t, time.Minute, "every other event applied", func() (bool, error) { return e.appliedTotal() >= 17, nil })
	e.assertInOrder([]string{"key-00", "key-02"}, 6)
	if got := fmt.Sprint(e.appliedOf("key-01")); got != "[0 1 2 4 5]" {
		t.Errorf("key-01 applied %s, want [0 1 2 4 5]", got)
	}
	if n := rt.count(OutcomeDeadLettered); n != 1 {
		t.Errorf("%d dead-lettered, want 1", n)
	}
}

// A store failure that is not the message's data (here an internal error a
// trigger raises, standing for a half-migrated schema or a server fault)
// dead-letters nothing: the batch is tried again in place, and when the fault
// outlasts those tries the session ends and the broker takes the deliveries
// back in order; once the fault is gone every key is stored and applied in
// the order published.
func TestBufferedIngestFaultNotOfTheDataReconnects(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	rt := e.startRefusing(`NEW.message_id = 'key-01-3' AND nextval('refusals') <= 7`, "XX000")
	keys := keyNames(3)
	e.publishEvents(keys, 6)
	testenv.Eventually(t, time.Minute, "every event applied", func() (bool, error) { return e.appliedTotal() >= 18, nil })
	e.assertInOrder(keys, 6)
	if n := rt.count(OutcomeDeadLettered); n != 0 {
		t.Errorf("%d dead-lettered, want none", n)
	}
	// The first refusal fails its batch, the next six the message alone (its
	// first try and ingestRetries more in place), which ends the session; the
	// redelivery is stored.
	if n := rt.reconnects(); n != 1 {
		t.Errorf("%d reconnects, want 1", n)
	}
}

// A graceful stop while the ingest tries a batch again in place gives the
// batch up and ends the session: what the broker sent after it is not stored
// by this session (it once was, by the stop's storing of the rest, before the
// batch, which the channel's close gave back), and the next session stores
// the key in order.
func TestBufferedGracefulStopDuringRetryKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	for _, stmt := range []string{
		`CREATE TABLE refusing (on_ boolean NOT NULL)`,
		`INSERT INTO refusing VALUES (true)`,
		`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.message_id = 'key-00-0' AND (SELECT on_ FROM refusing) THEN
				RAISE EXCEPTION 'internal trouble' USING ERRCODE = 'XX000';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER refuse BEFORE INSERT ON inbox_messages FOR EACH ROW EXECUTE FUNCTION refuse()`,
	} {
		if err := e.db.Exec(stmt).Error; err != nil {
			t.Fatal(err)
		}
	}
	tune := func(c *Config) {
		withBuffered(e.db, e.dbURL, nil)(c)
		c.Prefetch, c.GroupCommitMax, c.GroupCommitWait = 50, 1, 0
		c.ShutdownTimeout = 2 * time.Second
	}
	rt := e.start(orderedHandler(nil), tune)
	keys := keyNames(1)
	const perKey = 10
	e.publishEvents(keys, perKey)
	waitFor(t, "the ingest trying key-00-0 again in place", func() bool {
		return strings.Count(rt.logs.String(), "trying it again in place") >= 4
	})
	// The fault is gone for good, but the ingest sleeps 4 s before its next
	// try: the stop's drain (2 s) cancels it first.
	if err := e.db.Exec(`UPDATE refusing SET on_ = false`).Error; err != nil {
		t.Fatal(err)
	}
	rt.shutdown(t)
	t.Logf("stored by the first runtime: %d", rt.count(OutcomeStored))
	var ids []string
	if err := e.db.Raw(`SELECT message_id FROM inbox_messages WHERE ordering_key = 'key-00' ORDER BY seq`).Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	t.Logf("stored at the stop, in seq order: %v", ids)
	e.start(orderedHandler(nil), tune)
	waitFor(t, "every event applied", func() bool { return e.appliedTotal() >= perKey })
	if err := e.db.Raw(`SELECT message_id FROM inbox_messages WHERE ordering_key = 'key-00' ORDER BY seq`).Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	t.Logf("stored in the end, in seq order: %v", ids)
	e.assertInOrder(keys, perKey)
}

// Without single active consumer the buffered ingest stops as the inline one
// does, by cancelling its consumer, and stores what the broker had sent
// before the cancel took effect instead of giving it back: graceful restarts
// against a backlog cost nothing against the queue's delivery limit (2 here),
// and one replica at a time keeps every key in order.
func TestBufferedGracefulRestartsDoNotSpendTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, func(topo *rabbit.Topology) { topo.DeliveryLimit = 2 })
	keys := keyNames(10)
	const perKey = 40
	e.publishEvents(keys, perKey)
	tune := func(c *Config) {
		withBuffered(e.db, e.dbURL, nil)(c)
		c.Prefetch, c.GroupCommitMax, c.GroupCommitWait = 64, 4, 0
	}
	for i := range 10 {
		rt := e.start(orderedHandler(nil), tune)
		time.Sleep(time.Duration(20+7*i) * time.Millisecond)
		rt.shutdown(t)
	}
	e.start(orderedHandler(nil), tune)
	e.waitApplied(t, len(keys)*perKey)
	e.assertInOrder(keys, perKey)
	if d := e.queueDepth(e.topo.DeadLetterQueue); d != 0 {
		t.Errorf("%d messages dead-lettered by the broker's delivery limit", d)
	}
}

// startRefusing starts a buffered runtime on a table whose trigger refuses
// to store a message when cond holds, with the SQLSTATE code. A sequence
// refusals counts outside the refused transactions (nextval('refusals')).
func (e *env) startRefusing(cond, code string) *runtime {
	e.t.Helper()
	for _, stmt := range []string{
		`CREATE SEQUENCE refusals`,
		`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF ` + cond + ` THEN RAISE EXCEPTION 'refused by a trigger' USING ERRCODE = '` + code + `'; END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER refuse BEFORE INSERT ON inbox_messages FOR EACH ROW EXECUTE FUNCTION refuse()`,
	} {
		if err := e.db.Exec(stmt).Error; err != nil {
			e.t.Fatal(err)
		}
	}
	return e.start(orderedHandler(nil), func(c *Config) {
		withBuffered(e.db, e.dbURL, nil)(c)
		c.Prefetch, c.GroupCommitMax, c.GroupCommitWait = 50, 16, 5*time.Millisecond
	})
}
