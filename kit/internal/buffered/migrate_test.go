package buffered_test

import (
	"context"
	"os"
	"testing"
	"testing/fstest"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// A buffered inbox stored by the version that leased keys (the buffered
// set's version 2) keeps every message's place through the migration to
// message leases (00003): each key's head takes its key's schedule and
// lease, the messages behind it wait, and a parked head still blocks its key.
func TestMigrationToMessageLeasesKeepsEachKeysPlace(t *testing.T) {
	ctx := context.Background()
	db, _ := testenv.MigratedDB(t, migrations.Inbox)
	v2 := fstest.MapFS{}
	for _, f := range []string{"00001_buffered.sql", "00002_holds.sql"} {
		b, err := os.ReadFile("../../migrations/buffered/" + f)
		if err != nil {
			t.Fatal(err)
		}
		v2[f] = &fstest.MapFile{Data: b}
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, sqlDB, migrations.NewSet("buffered", v2)); err != nil {
		t.Fatal(err)
	}
	// As the key-leasing version left them: "a" leased to a worker (token
	// 7), "b" blocked by its parked head, "c" failed and due in an hour,
	// "d" past its first message and due.
	for _, q := range []string{
		`INSERT INTO inbox_keys (consumer, ordering_key, last_seq, next_seq, available_at, lease_token, blocked) VALUES
			('test', 'a', 3, 1, now() + interval '1 minute', 7, false),
			('test', 'b', 2, 1, now(), NULL, true),
			('test', 'c', 1, 1, now() + interval '1 hour', NULL, false),
			('test', 'd', 2, 2, now() - interval '1 minute', NULL, false)`,
		`INSERT INTO inbox_messages (consumer, message_id, ordering_key, seq, status, attempts, content_type, body) VALUES
			('test', 'a1', 'a', 1, 'processing', 1, 'application/json', '{}'),
			('test', 'a2', 'a', 2, 'pending', 0, 'application/json', '{}'),
			('test', 'a3', 'a', 3, 'pending', 0, 'application/json', '{}'),
			('test', 'b1', 'b', 1, 'parked', 5, 'application/json', '{}'),
			('test', 'b2', 'b', 2, 'pending', 0, 'application/json', '{}'),
			('test', 'c1', 'c', 1, 'failed', 1, 'application/json', '{}'),
			('test', 'd1', 'd', 1, 'processed', 1, 'application/json', '{}'),
			('test', 'd2', 'd', 2, 'pending', 0, 'application/json', '{}')`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	applied, err := migrations.Apply(ctx, sqlDB, migrations.Buffered)
	if err != nil || len(applied["buffered"]) != 1 {
		t.Fatalf("applied %v (%v), want the one migration to message leases", applied, err)
	}
	for _, tc := range []struct{ id, want string }{
		{"a1", "leased 7"}, {"a2", "waits"}, {"a3", "waits"}, {"b1", "parked"}, {"b2", "waits"},
		{"c1", "later"}, {"d2", "due"},
	} {
		var got string
		err := db.Raw(`SELECT CASE WHEN status = 'parked' THEN 'parked'
				WHEN available_at = 'infinity' THEN 'waits'
				WHEN lease_token IS NOT NULL THEN 'leased ' || lease_token
				WHEN available_at > now() THEN 'later' ELSE 'due' END
			FROM inbox_messages WHERE message_id = ?`, tc.id).Row().Scan(&got)
		if err != nil || got != tc.want {
			t.Errorf("%s: %s (%v), want %s", tc.id, got, err, tc.want)
		}
	}
	s := buffered.New(db, "test")
	st, err := s.Stats(ctx, false)
	if err != nil || st.BlockedKeys != 1 || st.BlockedMessages != 1 {
		t.Errorf("stats %+v (%v), want one blocked key with one message behind it", st, err)
	}
	// The store carries on: d2 is the only message due, and the lease on a
	// holds (its holder settles it).
	got := claim(t, s, 10, time.Minute)
	if len(got) != 1 || got[0].MessageID != "d2" {
		t.Fatalf("claimed %v, want [d2]", ids(got))
	}
	complete(t, s, got...)
	if n, err := s.Skip(ctx, buffered.Selector{OrderingKey: "b"}); err != nil || n != 1 {
		t.Fatalf("skip b1: %d, %v", n, err)
	}
	if got := claim(t, s, 10, time.Minute); len(got) != 1 || got[0].MessageID != "b2" {
		t.Fatalf("claimed %v after b1 was skipped, want [b2]", ids(got))
	}
}
