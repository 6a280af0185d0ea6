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

// The outbox is pruned with the inbox: rows sent longer ago than the window
// go, and the ordering keys left with none; pending and parked rows stay
// whatever their age, and so do their keys.
func TestPruneOutboxKeepsUnsentRows(t *testing.T) {
	gdb, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Outbox)
	db, err := gdb.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old, fresh := 20*day, time.Hour
	rows := []struct {
		name, key string
		seq       int
		status    string
		age       time.Duration
	}{
		{"done-1", "done", 1, "sent", old}, {"done-2", "done", 2, "sent", old},
		{"mixed-1", "mixed", 1, "sent", old}, {"mixed-2", "mixed", 2, "pending", old},
		{"parked-1", "parked", 1, "parked", old}, {"recent-1", "recent", 1, "sent", fresh},
		{"unordered-sent", "", 0, "sent", old}, {"unordered-pending", "", 0, "pending", old},
	}
	for i, r := range rows {
		var key, seq, sent any
		if r.key != "" {
			key, seq = r.key, r.seq
		}
		if r.status == "sent" {
			sent = time.Now().Add(-r.age)
		}
		_, err := db.ExecContext(ctx, `INSERT INTO outbox (id, producer, exchange, routing_key, content_type, body, ordering_key, seq, status, created_at, sent_at, headers)
			VALUES ($1, 'payments', 'x', 'k', 'application/json', '{}', $2, $3, $4, now() - make_interval(secs => $5), $6, jsonb_build_object('name', $7::text))`,
			fmt.Sprintf("00000000-0000-7000-8000-%012d", i), key, seq, r.status, r.age.Seconds(), sent, r.name)
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox_keys (producer, ordering_key, last_seq, next_seq) VALUES
		('payments', 'done', 2, 3), ('payments', 'mixed', 2, 2), ('payments', 'parked', 1, 1), ('payments', 'recent', 1, 2)`); err != nil {
		t.Fatal(err)
	}
	p, err := New(db, Config{Consumer: "payments", Window: 14 * day, BatchSize: 2, RetryDelays: []time.Duration{time.Second},
		MaxAttempts: 5, Outbox: true}, NewMetrics(prometheus.NewRegistry()), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.DeletedSent != 4 || res.DeletedOutboxKeys != 1 {
		t.Errorf("deleted %d sent rows and %d keys, want 4 (done ×2, mixed's sent, unordered sent) and 1 (done)", res.DeletedSent, res.DeletedOutboxKeys)
	}
	var left []string
	if err := gdb.Raw(`SELECT headers->>'name' FROM outbox ORDER BY 1`).Scan(&left).Error; err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(left); got != "[mixed-2 parked-1 recent-1 unordered-pending]" {
		t.Errorf("rows left %s", got)
	}
	var keys []string
	if err := gdb.Raw(`SELECT ordering_key FROM outbox_keys ORDER BY 1`).Scan(&keys).Error; err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(keys); got != "[mixed parked recent]" {
		t.Errorf("keys left %s", got)
	}
}
