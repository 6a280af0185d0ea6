package testenv

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
)

// ParkBuffered stores a message id of key in the buffered inbox of consumer
// (db migrated with migrations.Buffered: the test's own, with no processor
// running), with behind more messages of the key after it, and parks it with
// reason and detail as the processor does after a permanent error: what the
// inbox commands (status, parked, retry, skip, export) are tested on. The
// messages behind wait, the key blocked. Its body is {"order_id":key}, its
// x-original-exchange "orders". To reach it, it claims the consumer's due
// messages (the keys' heads) and puts every other one back with an hour's
// delay; it fails the test if the message is not among them (key must be
// new).
func ParkBuffered(t testing.TB, db *gorm.DB, consumer, id, key string, behind int, reason, detail string) {
	t.Helper()
	ctx := context.Background()
	s := buffered.New(db, consumer)
	in := []buffered.Incoming{{MessageID: id, OrderingKey: key, ContentType: "application/json",
		Body: []byte(`{"order_id":"` + key + `"}`), Headers: map[string]any{"x-original-exchange": "orders"}}}
	for i := range behind {
		in = append(in, buffered.Incoming{MessageID: id + "-next-" + string(rune('a'+i)), OrderingKey: key, ContentType: "application/json", Body: []byte(`{}`)})
	}
	if _, err := s.Ingest(ctx, in, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Claim(ctx, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	parked := false
	for _, c := range cs {
		if c.MessageID == id {
			if ok, err := s.Park(ctx, c.Lease, reason, detail); !ok || err != nil {
				t.Fatalf("park %s: %v %v", id, ok, err)
			}
			parked = true
		} else if _, err := s.Release(ctx, c.Lease, time.Hour, "not this test's", false); err != nil {
			t.Fatal(err)
		}
	}
	if !parked {
		t.Fatalf("park %s: the claim of %d due messages did not reach it (is %s new, and the only work due?)", id, len(cs), key)
	}
}
