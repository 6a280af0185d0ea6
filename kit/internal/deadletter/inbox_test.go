package deadletter

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// startRuntime runs a consumer runtime on b's work queue whose handler records
// one effect per message in db; the wiring is kit/internal/consumer's test harness,
// cut to what a replay needs.
func startRuntime(t *testing.T, b *broker, db *gorm.DB) *consumer.Metrics {
	t.Helper()
	if err := db.Exec(`CREATE TABLE effects (message_id text NOT NULL)`).Error; err != nil {
		t.Fatal(err)
	}
	record := consumer.HandlerFunc(func(_ context.Context, msg consumer.Message) (consumer.Writes, error) {
		return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
			return consumer.OutcomeProcessed, tx.Exec(`INSERT INTO effects (message_id) VALUES (?)`, msg.ID).Error
		}, nil
	})
	cfg := consumer.Config{
		Name: "test", AMQPURL: b.url, Heartbeat: 2 * time.Second, Topology: b.topo,
		Prefetch: 4, Workers: 2, MaxAttempts: 3, ShutdownTimeout: 5 * time.Second, ReconnectMaxWait: time.Second,
		DatabaseCheck: func(ctx context.Context) error { return database.Ping(ctx, db) },
	}
	m := consumer.NewMetrics(prometheus.NewRegistry())
	rt, err := consumer.New(cfg, inbox.New(db, cfg.Name), record, 5*time.Second, m, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runtime: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("runtime did not stop within 30s")
		}
	})
	testenv.Eventually(t, 30*time.Second, "runtime ready", func() (bool, error) { return rt.Ready() == nil, nil })
	return m
}

func effects(t *testing.T, db *gorm.DB, id string) int {
	t.Helper()
	var n int64
	if err := db.Table("effects").Where("message_id = ?", id).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// A dead letter whose message was applied after all (its copy reached the
// dead-letter queue, then the original was redelivered and committed) is
// replayed as a duplicate and suppressed by the inbox; a dead letter never
// applied is applied once.
func TestReplayedMessagesAreAppliedOnce(t *testing.T) {
	b := newBroker(t)
	db, _ := testenv.MigratedDB(t, migrations.Inbox)
	m := startRuntime(t, b, db)

	// The message was applied once through the work queue: say a copy of it
	// had been dead-lettered before a redelivery of the original succeeded.
	ch := b.channel()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if err := rabbit.PublishConfirmed(context.Background(), ch, b.topo.Exchange, b.topo.RoutingKey, amqp.Publishing{
		MessageId: "applied", ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Body: []byte(`{"event_id":"applied","order_id":"o-1"}`), // the body put() gives the dead letter
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the original processed", func() (bool, error) {
		return m.Settled("test", consumer.OutcomeProcessed) == 1, nil
	})
	b.put(deadLetter{"applied", "o-1", "retries_exhausted", 3, 0}, deadLetter{"never-applied", "o-2", "retries_exhausted", 3, 0})
	b.waitDepth(b.topo.DeadLetterQueue, 2)

	rep, err := b.queue().Replay(context.Background(), Selector{All: true}, ReplayOptions{MaxReplays: 3, MaxAge: keyLifetime})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Replayed) != 2 {
		t.Fatalf("replayed %v, want both", ids(rep.Replayed))
	}
	testenv.Eventually(t, 30*time.Second, "one duplicate and one processed", func() (bool, error) {
		return m.Settled("test", consumer.OutcomeDuplicate) == 1 && m.Settled("test", consumer.OutcomeProcessed) == 2, nil
	})
	for _, id := range []string{"applied", "never-applied"} {
		if n := effects(t, db, id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	b.waitDepth(b.topo.DeadLetterQueue, 0)
	b.waitDepth(b.topo.Queue, 0)
}
