package retention

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// The buffered inbox is pruned with the inbox: finished messages older than
// the window go, and the keys left without any message; messages still to
// process or parked stay whatever their age, and so do their keys and their
// inbox rows (their dedupe: a redelivery must not be stored again).
func TestPruneBufferedKeepsUnfinishedMessages(t *testing.T) {
	gdb, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Buffered)
	db, err := gdb.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old, fresh := 20*day, time.Hour
	rows := []struct {
		key    string
		seq    int
		status string
		age    time.Duration
	}{
		{"done", 1, "processed", old}, {"done", 2, "skipped", old}, // key done: all gone, key too
		{"mixed", 1, "processed", old}, {"mixed", 2, "pending", old}, // the pending one and its key stay
		{"parked", 1, "parked", old}, {"failed", 1, "failed", old}, {"busy", 1, "processing", old},
		{"recent", 1, "processed", fresh}, {"dead", 1, "dead_lettered", old},
	}
	for _, r := range rows {
		var finished any
		if r.status == "processed" || r.status == "skipped" || r.status == "dead_lettered" {
			finished = time.Now().Add(-r.age)
		}
		_, err := db.ExecContext(ctx, `INSERT INTO inbox_messages (consumer, message_id, ordering_key, seq, status, content_type, body, received_at, finished_at)
			VALUES ('payments', $1, $2, $3, $4, 'application/json', '{}', now() - make_interval(secs => $5), $6)`,
			r.key+"-"+r.status, r.key, r.seq, r.status, r.age.Seconds(), finished)
		if err != nil {
			t.Fatal(err)
		}
		// Its inbox row, as old as the message ("dead"'s was deleted by its export).
		if r.status != "dead_lettered" {
			_, err = db.ExecContext(ctx, `INSERT INTO inbox (message_id, consumer, payload_sha256, received_at)
				VALUES ($1, 'payments', sha256(convert_to($1, 'UTF8')), now() - make_interval(secs => $2))`, r.key+"-"+r.status, r.age.Seconds())
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	_, err = db.ExecContext(ctx, `INSERT INTO inbox_keys (consumer, ordering_key, last_seq, next_seq) VALUES
		('payments', 'done', 2, 3), ('payments', 'mixed', 2, 2), ('payments', 'parked', 1, 1),
		('payments', 'failed', 1, 1), ('payments', 'busy', 1, 1), ('payments', 'recent', 1, 2),
		('payments', 'dead', 1, 2)`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(db, Config{Consumer: "payments", Window: 14 * day, BatchSize: 2, RetryDelays: []time.Duration{time.Second},
		MaxAttempts: 5, Buffered: true}, NewMetrics(prometheus.NewRegistry()), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	pending, err := p.Pending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pending.Rows != 3 || pending.Messages != 4 {
		t.Errorf("dry run counts %d inbox rows and %d messages, want 3 (done ×2, mixed's processed) and 4", pending.Rows, pending.Messages)
	}
	res, err := p.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 3 {
		t.Errorf("deleted %d inbox rows, want 3: only the finished messages' rows", res.Deleted)
	}
	if res.DeletedMessages != 4 || res.DeletedKeys != 2 {
		t.Errorf("deleted %d messages and %d keys, want 4 (done ×2, mixed's processed, dead) and 2 (done, dead)", res.DeletedMessages, res.DeletedKeys)
	}
	var left []string
	if err := gdb.Raw(`SELECT message_id FROM inbox_messages ORDER BY message_id`).Scan(&left).Error; err != nil {
		t.Fatal(err)
	}
	want := "[busy-processing failed-failed mixed-pending parked-parked recent-processed]"
	if got := fmt.Sprint(left); got != want {
		t.Errorf("messages left %s, want %s", got, want)
	}
	var keys []string
	if err := gdb.Raw(`SELECT ordering_key FROM inbox_keys ORDER BY ordering_key`).Scan(&keys).Error; err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(keys); got != "[busy failed mixed parked recent]" {
		t.Errorf("keys left %s", got)
	}
	var dedupe []string
	if err := gdb.Raw(`SELECT message_id FROM inbox ORDER BY message_id`).Scan(&dedupe).Error; err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(dedupe); got != want {
		t.Errorf("inbox rows left %s, want those of the messages left, %s", got, want)
	}
}
