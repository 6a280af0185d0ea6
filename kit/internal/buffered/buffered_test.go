package buffered_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// setup returns a store on a migrated database with an effects table that
// stands for a handler's business writes.
func setup(t testing.TB) (*buffered.Store, *gorm.DB) {
	t.Helper()
	db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Buffered)
	if err := db.Exec(`CREATE TABLE effects (message_id text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	return buffered.New(db, "test"), db
}

func msg(id, key, body string) buffered.Incoming {
	return buffered.Incoming{MessageID: id, OrderingKey: key, ContentType: "application/json", Body: []byte(body),
		Headers: map[string]any{"x-attempt": int32(1)}}
}

func ingest(t testing.TB, s *buffered.Store, items ...buffered.Incoming) []buffered.Stored {
	t.Helper()
	res, err := s.Ingest(context.Background(), items, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func claim(t testing.TB, s *buffered.Store, n int, lease time.Duration) []buffered.Claimed {
	t.Helper()
	c, err := s.Claim(context.Background(), n, lease)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func effect(id string) func(tx *gorm.DB) (string, error) {
	return func(tx *gorm.DB) (string, error) {
		return "processed", tx.Exec(`INSERT INTO effects (message_id) VALUES (?)`, id).Error
	}
}

func complete(t testing.TB, s *buffered.Store, cs ...buffered.Claimed) []buffered.Completed {
	t.Helper()
	items := make([]buffered.Completion, len(cs))
	for i, c := range cs {
		items[i] = buffered.Completion{Lease: c.Lease, Apply: effect(c.MessageID)}
	}
	res, err := s.Complete(context.Background(), items, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func ids(cs []buffered.Claimed) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.MessageID
	}
	return out
}

func scalar(t testing.TB, db *gorm.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Raw(sql, args...).Row().Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func status(t testing.TB, db *gorm.DB, id string) string {
	t.Helper()
	var s string
	if err := db.Raw(`SELECT status FROM inbox_messages WHERE message_id = ? ORDER BY id DESC LIMIT 1`, id).Row().Scan(&s); err != nil {
		t.Fatalf("status of %s: %v", id, err)
	}
	return s
}

// Ingest claims each id once, numbers each key's messages in the order given
// (not in id order) and tells duplicates and reused ids apart.
func TestIngestDedupesAndNumbersEachKeyInOrder(t *testing.T) {
	s, db := setup(t)
	res := ingest(t, s, msg("m9", "a", "1"), msg("m1", "b", "2"), msg("m5", "a", "3"), msg("m9", "a", "1"), msg("m2", "", "4"))
	want := []bool{true, true, true, false, true}
	for i, r := range res {
		if r.Fresh != want[i] || r.Err != nil {
			t.Errorf("item %d: %+v, want fresh=%v", i, r, want[i])
		}
	}
	res = ingest(t, s, msg("m1", "b", "2"), msg("m5", "a", "other body"), msg("m3", "a", "5"))
	if res[0].Fresh || res[0].Err != nil {
		t.Errorf("redelivery: %+v, want a duplicate", res[0])
	}
	if !errors.Is(res[1].Err, buffered.ErrPayloadMismatch) {
		t.Errorf("reused id: %+v, want ErrPayloadMismatch", res[1])
	}
	rows, err := db.Raw(`SELECT message_id, ordering_key, seq FROM inbox_messages ORDER BY ordering_key, seq`).Rows()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id, key string
		var seq int
		if err := rows.Scan(&id, &key, &seq); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%s#%d", key, id, seq))
	}
	wantRows := fmt.Sprint([]string{"a:m9#1", "a:m5#2", "a:m3#3", "b:m1#1", "message:m2:m2#1"})
	if fmt.Sprint(got) != wantRows {
		t.Errorf("stored %v, want %v", got, wantRows)
	}
	if n := scalar(t, db, `SELECT count(*) FROM inbox`); n != 5 {
		t.Errorf("%d inbox rows, want 5", n)
	}
}

// A claim takes the head of each due key, never two messages of one key; the
// next message of a key is due only once its head is processed.
func TestClaimTakesOneHeadPerKey(t *testing.T) {
	s, db := setup(t)
	ingest(t, s, msg("a1", "a", "1"), msg("a2", "a", "2"), msg("b1", "b", "3"), msg("a3", "a", "4"))
	first := claim(t, s, 10, time.Minute)
	if got := fmt.Sprint(ids(first)); len(first) != 2 || (got != "[a1 b1]" && got != "[b1 a1]") {
		t.Fatalf("first claim %v, want the heads a1 and b1", got)
	}
	if again := claim(t, s, 10, time.Minute); len(again) != 0 {
		t.Fatalf("claimed %v while every key's head is leased", ids(again))
	}
	if first[0].Attempts != 1 || status(t, db, "a1") != "processing" {
		t.Errorf("attempts %d, status %s: want 1, processing", first[0].Attempts, status(t, db, "a1"))
	}
	for _, r := range complete(t, s, first...) {
		if r.Err != nil || r.Lost || r.Outcome != "processed" {
			t.Fatalf("complete: %+v", r)
		}
	}
	for _, want := range []string{"a2", "a3"} {
		next := claim(t, s, 10, time.Minute)
		if len(next) != 1 || next[0].MessageID != want {
			t.Fatalf("claimed %v, want [%s]", ids(next), want)
		}
		complete(t, s, next...)
	}
	if n := scalar(t, db, `SELECT count(*) FROM inbox_messages WHERE status = 'processed'`); n != 4 {
		t.Errorf("%d processed, want 4", n)
	}
	if n := scalar(t, db, `SELECT count(*) FROM effects`); n != 4 {
		t.Errorf("%d effects, want 4", n)
	}
}

// A message appended to a key while its head's settlement waits for the
// key (an ingest holds the key's row to its commit) is made due by that
// settlement: the settlement reads the successors after it holds the key,
// so it sees the message the ingest committed. Read in the statement that
// waited, the message would be missed, and would wait at infinity forever.
func TestSettlementMakesDueAMessageAppendedWhileItWaited(t *testing.T) {
	s, db := setup(t)
	ingest(t, s, msg("m1", "k", `{}`))
	head := claim(t, s, 10, time.Minute)
	if len(head) != 1 {
		t.Fatalf("claimed %v, want m1", ids(head))
	}
	appended, release := make(chan struct{}), make(chan struct{})
	ingested := make(chan error, 1)
	go func() {
		_, err := s.Ingest(context.Background(), []buffered.Incoming{msg("m2", "k", `{}`)}, func() {
			close(appended)
			<-release
		})
		ingested <- err
	}()
	<-appended
	if st := scalar(t, db, `SELECT count(*) FROM inbox_messages WHERE message_id = 'm2'`); st != 0 {
		t.Fatal("m2 is visible before its ingest committed")
	}
	completed := make(chan []buffered.Completed, 1)
	go func() {
		res, err := s.Complete(context.Background(), []buffered.Completion{{Lease: head[0].Lease, Apply: effect("m1")}}, nil)
		if err != nil {
			t.Error(err)
		}
		completed <- res
	}()
	// The settlement waits for the key's row, held by the ingest.
	for scalar(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%inbox_keys%'`) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	if err := <-ingested; err != nil {
		t.Fatal(err)
	}
	if res := <-completed; len(res) != 1 || res[0].Err != nil || res[0].Lost {
		t.Fatalf("m1's completion: %+v", res)
	}
	if next := claim(t, s, 10, time.Minute); len(next) != 1 || next[0].MessageID != "m2" {
		t.Fatalf("claimed %v after m1 was processed, want m2", ids(next))
	}
}

// A worker whose lease expired and passed to another commits nothing: its
// writes roll back, alone in a group commit.
func TestLostLeaseCommitsNothing(t *testing.T) {
	s, db := setup(t)
	ingest(t, s, msg("a1", "a", "1"), msg("b1", "b", "2"))
	stale := claim(t, s, 10, 0) // a lease that is over at once: the holder "died"
	if len(stale) != 2 {
		t.Fatalf("claimed %d, want 2", len(stale))
	}
	fresh := claim(t, s, 1, time.Minute)
	if len(fresh) != 1 || fresh[0].Attempts != 2 {
		t.Fatalf("second claim %+v: want one message on its second attempt", fresh)
	}
	res := complete(t, s, stale...) // one lease lost, one still the stale claim's
	lost := 0
	for i, r := range res {
		if r.Lost != (stale[i].MessageID == fresh[0].MessageID) {
			t.Errorf("%s: %+v", stale[i].MessageID, r)
		}
		if r.Lost {
			lost++
		}
	}
	if lost != 1 || scalar(t, db, `SELECT count(*) FROM effects WHERE message_id = ?`, fresh[0].MessageID) != 0 {
		t.Fatalf("lost %d; the lost message's writes committed: %d", lost, scalar(t, db, `SELECT count(*) FROM effects`))
	}
	if r := complete(t, s, fresh...); r[0].Lost || r[0].Err != nil {
		t.Fatalf("the lease holder: %+v", r[0])
	}
	if n := scalar(t, db, `SELECT count(*) FROM effects`); n != 2 {
		t.Errorf("%d effects, want 2: each message once", n)
	}
}

// In a group commit a message whose writes fail is rolled back alone and
// stays processing under its lease; the others commit.
func TestGroupCompleteIsolatesAFailingMessage(t *testing.T) {
	s, db := setup(t)
	ingest(t, s, msg("a1", "a", "1"), msg("b1", "b", "2"), msg("c1", "c", "3"))
	cs := claim(t, s, 10, time.Minute)
	boom := errors.New("boom")
	items := make([]buffered.Completion, len(cs))
	for i, c := range cs {
		apply := effect(c.MessageID)
		if c.MessageID == "b1" {
			apply = func(tx *gorm.DB) (string, error) {
				if _, err := effect("b1")(tx); err != nil {
					return "", err
				}
				return "", boom
			}
		}
		items[i] = buffered.Completion{Lease: c.Lease, Apply: apply}
	}
	res, err := s.Complete(context.Background(), items, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if failed := cs[i].MessageID == "b1"; failed != errors.Is(r.Err, boom) {
			t.Errorf("%s: %+v", cs[i].MessageID, r)
		}
	}
	if got := scalar(t, db, `SELECT count(*) FROM effects`); got != 2 || status(t, db, "b1") != "processing" {
		t.Errorf("%d effects, b1 %s: want 2 and b1 still processing", got, status(t, db, "b1"))
	}
}

// A failed run makes its key due again after the delay; the messages behind
// it wait. A parked head blocks its key and no other; retry re-arms it with a
// fresh budget, skip moves the key on.
func TestFailParkRetrySkip(t *testing.T) {
	s, db := setup(t)
	ctx := context.Background()
	ingest(t, s, msg("a1", "a", "1"), msg("a2", "a", "2"), msg("b1", "b", "3"), msg("b2", "b", "4"))
	cs := claim(t, s, 10, time.Minute)
	byID := map[string]buffered.Claimed{}
	for _, c := range cs {
		byID[c.MessageID] = c
	}
	if ok, err := s.Fail(ctx, byID["a1"].Lease, time.Hour, "gateway answered 503"); !ok || err != nil {
		t.Fatalf("fail: %v %v", ok, err)
	}
	if ok, err := s.Park(ctx, byID["b1"].Lease, "gateway_rejected", "402"); !ok || err != nil {
		t.Fatalf("park: %v %v", ok, err)
	}
	if got := claim(t, s, 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %v: a is waiting an hour, b is blocked", ids(got))
	}
	if at, ok, err := s.NextDue(ctx); err != nil || !ok || time.Until(at) < 50*time.Minute {
		t.Errorf("next due %v %v %v: want a's retry in an hour", at, ok, err)
	}
	st, err := s.Stats(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if st.Counts[buffered.StatusFailed] != 1 || st.Counts[buffered.StatusParked] != 1 || st.Counts[buffered.StatusPending] != 2 ||
		st.BlockedKeys != 1 || st.BlockedMessages != 1 || st.OldestUnfinished.IsZero() {
		t.Errorf("stats %+v", st)
	}
	parked, err := s.ListParked(ctx, buffered.Selector{All: true}, 10)
	if err != nil || len(parked) != 1 || parked[0].MessageID != "b1" || parked[0].Reason != "gateway_rejected" || parked[0].Waiting != 1 {
		t.Fatalf("parked %+v %v", parked, err)
	}
	if n, err := s.Retry(ctx, buffered.Selector{OrderingKey: "b"}); n != 1 || err != nil {
		t.Fatalf("retry: %d %v", n, err)
	}
	again := claim(t, s, 10, time.Minute)
	if len(again) != 1 || again[0].MessageID != "b1" || again[0].Attempts != 1 {
		t.Fatalf("after retry claimed %+v, want b1 with a fresh budget", again)
	}
	if ok, _ := s.Park(ctx, again[0].Lease, "gateway_rejected", "402"); !ok {
		t.Fatal("park again")
	}
	if n, err := s.Skip(ctx, buffered.Selector{MessageID: "b1"}); n != 1 || err != nil {
		t.Fatalf("skip: %d %v", n, err)
	}
	next := claim(t, s, 10, time.Minute)
	if len(next) != 1 || next[0].MessageID != "b2" || status(t, db, "b1") != "skipped" {
		t.Fatalf("after skip claimed %v (b1 %s), want b2", ids(next), status(t, db, "b1"))
	}
	if n, _ := s.Retry(ctx, buffered.Selector{All: true}); n != 0 {
		t.Errorf("retry of nothing parked re-armed %d", n)
	}
}

// A parked message exported to the dead-letter queue leaves its key and the
// inbox: a replay of it is stored again, at the end of its key.
func TestDeadLetteredMessageCanBeStoredAgain(t *testing.T) {
	s, db := setup(t)
	ctx := context.Background()
	ingest(t, s, msg("a1", "a", "1"), msg("a2", "a", "2"))
	c := claim(t, s, 1, time.Minute)[0]
	if ok, _ := s.Park(ctx, c.Lease, "invalid_field", "bad"); !ok {
		t.Fatal("park")
	}
	parked, err := s.ListParked(ctx, buffered.Selector{MessageID: "a1"}, 1)
	if err != nil || len(parked) != 1 || parked[0].Headers["x-attempt"] != int64(1) {
		t.Fatalf("parked %+v %v", parked, err)
	}
	if ok, err := s.MarkDeadLettered(ctx, parked[0]); !ok || err != nil {
		t.Fatalf("mark dead-lettered: %v %v", ok, err)
	}
	if ok, _ := s.MarkDeadLettered(ctx, parked[0]); ok {
		t.Error("marked twice")
	}
	if next := claim(t, s, 1, time.Minute); len(next) != 1 || next[0].MessageID != "a2" {
		t.Fatalf("claimed %v, want a2 after the export", ids(next))
	}
	if res := ingest(t, s, msg("a1", "a", "1")); !res[0].Fresh {
		t.Fatalf("the replay: %+v, want stored again", res[0])
	}
	if n := scalar(t, db, `SELECT seq FROM inbox_messages WHERE message_id = 'a1' AND status = 'pending'`); n != 3 {
		t.Errorf("replay stored as #%d of its key, want #3", n)
	}
}

// Release gives a message back without spending its attempt.
func TestReleaseSpendsNoAttempt(t *testing.T) {
	s, db := setup(t)
	ctx := context.Background()
	ingest(t, s, msg("a1", "a", "1"))
	c := claim(t, s, 1, time.Minute)[0]
	if ok, err := s.Release(ctx, c.Lease, 0, "database down", false); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if st := status(t, db, "a1"); st != "pending" {
		t.Errorf("status %s, want pending", st)
	}
	if again := claim(t, s, 1, time.Minute); len(again) != 1 || again[0].Attempts != 1 {
		t.Fatalf("claimed %+v, want a1 on attempt 1", again)
	}
}

// A release that counts (a pause the handler asked for) adds to the
// message's holds, which the next claim reads and which no other release
// changes; an operator's retry of the parked message resets them with its
// attempts.
func TestReleaseCountsHoldsAndRetryResetsThem(t *testing.T) {
	s, _ := setup(t)
	ctx := context.Background()
	ingest(t, s, msg("a1", "a", "1"))
	for i, r := range []struct {
		holds  int // before this claim's release
		counts bool
	}{{0, true}, {1, false}, {1, true}} {
		c := claim(t, s, 1, time.Minute)[0]
		if c.Holds != r.holds {
			t.Fatalf("claim %d: holds %d, want %d", i+1, c.Holds, r.holds)
		}
		if ok, err := s.Release(ctx, c.Lease, 0, "paused", r.counts); !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
	}
	c := claim(t, s, 1, time.Minute)[0]
	if c.Holds != 2 || c.Attempts != 1 {
		t.Fatalf("holds %d, attempt %d: want 2 holds and attempt 1", c.Holds, c.Attempts)
	}
	if ok, _ := s.Park(ctx, c.Lease, "held_too_often", "paused"); !ok {
		t.Fatal("park")
	}
	if n, err := s.Retry(ctx, buffered.Selector{MessageID: "a1"}); n != 1 || err != nil {
		t.Fatalf("retry: %d %v", n, err)
	}
	if again := claim(t, s, 1, time.Minute); len(again) != 1 || again[0].Holds != 0 {
		t.Fatalf("claimed %+v after the retry, want a1 with no holds", again)
	}
}

func TestSelectorValidate(t *testing.T) {
	for _, sel := range []buffered.Selector{{}, {MessageID: "a", All: true}, {MessageID: "a", OrderingKey: "k"}} {
		if sel.Validate() == nil {
			t.Errorf("%+v: no error", sel)
		}
	}
	if err := (buffered.Selector{OrderingKey: "k"}).Validate(); err != nil {
		t.Error(err)
	}
}

// A completion whose lease was lost (message N, taken over and settled by a
// later claim) lands in one group commit with the completion of its key's
// next message: the key advances for the next message only, so the stale
// completion is lost and its writes roll back (the settling once matched
// input rows to advanced keys by key alone, and applied N twice).
func TestStaleCompletionBatchedWithNextOfItsKeyCommitsNothing(t *testing.T) {
	s, db := setup(t)
	ingest(t, s, msg("k1", "k", "1"), msg("k2", "k", "2"))
	stale := claim(t, s, 10, 0) // worker A: its lease is over at once (it hung)
	if len(stale) != 1 || stale[0].MessageID != "k1" {
		t.Fatalf("first claim %v", ids(stale))
	}
	again := claim(t, s, 10, time.Minute) // worker B takes k1 over
	if len(again) != 1 || again[0].MessageID != "k1" {
		t.Fatalf("second claim %v", ids(again))
	}
	if r := complete(t, s, again...); r[0].Lost || r[0].Err != nil {
		t.Fatalf("B's completion: %+v", r[0])
	}
	next := claim(t, s, 10, time.Minute) // worker C: k2
	if len(next) != 1 || next[0].MessageID != "k2" {
		t.Fatalf("third claim %v", ids(next))
	}
	// A's handler returns late; its writes reach the same group commit as C's.
	res := complete(t, s, stale[0], next[0])
	if !res[0].Lost {
		t.Errorf("A's stale completion of k1: %+v, want Lost", res[0])
	}
	if n := scalar(t, db, `SELECT count(*) FROM effects WHERE message_id = 'k1'`); n != 1 {
		t.Errorf("k1 applied %d times, want 1", n)
	}
}
