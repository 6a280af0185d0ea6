package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// inbox status, parked, retry, skip and export on the buffered inbox of the
// service's configuration; an exported message is a dead letter like any.
func TestBufferedInboxCommands(t *testing.T) {
	e := newDLQEnv(t)
	gdb, url := kittest.MigratedDB(t, migrations.Inbox, migrations.Buffered)
	t.Setenv("DATABASE_URL", url)
	for _, p := range []struct {
		id, key string
		behind  int
	}{{"m-1", "order-1", 2}, {"m-2", "order-2", 0}, {"m-3", "order-3", 1}} {
		kittest.ParkBuffered(t, gdb, "payment-service", p.id, p.key, p.behind, "invalid_field", "amount_cents must be positive")
	}

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
	out, err = inboxctl(t, "", "inbox", "status", "--json")
	st = struct {
		Counts      map[string]int `json:"counts"`
		BlockedKeys int            `json:"blocked_keys"`
	}{}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Counts["parked"] != 0 || st.Counts["skipped"] != 1 ||
		st.Counts["dead_lettered"] != 1 || st.BlockedKeys != 0 {
		t.Errorf("after retry, skip and export: err %v, output %q", err, out)
	}
	var inboxRow int64
	gdb.Table("inbox").Where("message_id = 'm-2'").Count(&inboxRow)
	if inboxRow != 0 {
		t.Error("the exported message is still in the inbox: its replay would be taken for a duplicate")
	}
}
