package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/buffered"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/testenv"
)

// park stores a message of key and parks it, as the processor would after a
// permanent error.
func park(t *testing.T, s *buffered.Store, id, key string, behind int) {
	t.Helper()
	ctx := context.Background()
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
	for _, c := range cs {
		if c.MessageID == id {
			if ok, err := s.Park(ctx, c.Lease, "invalid_field", "amount_cents must be positive"); !ok || err != nil {
				t.Fatalf("park: %v %v", ok, err)
			}
		} else if _, err := s.Release(ctx, c.Lease, time.Hour, "not this test's", false); err != nil {
			t.Fatal(err)
		}
	}
}

// inbox status, parked, retry, skip and export on the buffered inbox of the
// service's configuration; an exported message is a dead letter like any.
func TestBufferedInboxCommands(t *testing.T) {
	e := newDLQEnv(t)
	gdb, url := testenv.MigratedDB(t, migrations.Inbox, migrations.Buffered)
	t.Setenv("DATABASE_URL", url)
	s := buffered.New(gdb, "payment-service")
	park(t, s, "m-1", "order-1", 2)
	park(t, s, "m-2", "order-2", 0)
	park(t, s, "m-3", "order-3", 1)

	out, err := inboxctl(t, "", "inbox", "status")
	for _, want := range []string{"parked  3", "pending  3", "blocked keys: 3 (a parked head each; 3 messages wait behind them)", "oldest unprocessed:"} {
		if err != nil || !strings.Contains(strings.Join(strings.Fields(out), "  "), strings.Join(strings.Fields(want), "  ")) {
			t.Errorf("status: err %v, output %q; want %q", err, out, want)
		}
	}
	out, err = inboxctl(t, "", "inbox", "status", "--json")
	var st struct {
		Counts      map[string]int `json:"counts"`
		BlockedKeys int            `json:"blocked_keys"`
	}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Counts["parked"] != 3 || st.BlockedKeys != 3 {
		t.Errorf("status --json: err %v, output %q", err, out)
	}
	if out, err := inboxctl(t, "", "inbox", "parked"); err != nil || !strings.Contains(out, "order-1") || !strings.Contains(out, "invalid_field") {
		t.Errorf("parked: err %v, output %q", err, out)
	}

	if out, err := inboxctl(t, "", "inbox", "retry", "--key", "order-1"); err != nil || !strings.Contains(out, "re-armed 1 parked messages") {
		t.Errorf("retry: err %v, output %q", err, out)
	}
	if out, err := inboxctl(t, "", "inbox", "skip", "--id", "m-3"); err != nil || !strings.Contains(out, "skipped 1 parked messages") {
		t.Errorf("skip: err %v, output %q", err, out)
	}
	if out, err := inboxctl(t, "", "inbox", "export", "--all", "--dry-run"); err != nil || !strings.Contains(out, "would export m-2") {
		t.Errorf("export --dry-run: err %v, output %q", err, out)
	}
	if out, err := inboxctl(t, "", "inbox", "export", "--all"); err != nil || !strings.Contains(out, "exported m-2 (key order-2, reason invalid_field)") {
		t.Fatalf("export: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.DeadLetterQueue, 1)
	out, err = inboxctl(t, "", "dlq", "list")
	if err != nil || !strings.Contains(out, "m-2") || !strings.Contains(out, "order_id=order-2") || !strings.Contains(out, "invalid_field") {
		t.Errorf("dlq list after the export: err %v, output %q", err, out)
	}
	st2, err := s.Stats(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Counts[buffered.StatusParked] != 0 || st2.Counts[buffered.StatusSkipped] != 1 || st2.Counts[buffered.StatusDeadLettered] != 1 || st2.BlockedKeys != 0 {
		t.Errorf("after retry, skip and export: %+v", st2)
	}
	var inboxRow int64
	gdb.Table("inbox").Where("message_id = 'm-2'").Count(&inboxRow)
	if inboxRow != 0 {
		t.Error("the exported message is still in the inbox: its replay would be taken for a duplicate")
	}
}
