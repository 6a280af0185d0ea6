package deadletter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// keyTTL is the scaled-down lifetime of the called service's idempotency keys.
const keyTTL = 2 * time.Second

// outsideCalls is a handler standing for a charge: every run calls out (and
// is counted); it fails while failing is set, as when the gateway took the
// charge but its response was lost, then answered 503.
type outsideCalls struct {
	n       atomic.Int64
	failing atomic.Bool
}

func (o *outsideCalls) Handle(context.Context, consumer.Message) (consumer.Writes, error) {
	o.n.Add(1)
	if o.failing.Load() {
		return nil, errors.New("gateway: response lost")
	}
	return consumer.NoWrites(consumer.OutcomeProcessed), nil
}

// runGuarded runs a runtime with the key-expiry guard on (keyTTL), two
// attempts and no pause, in the buffered mode when store is set, until the
// returned function stops it.
func runGuarded(t *testing.T, b *broker, db *gorm.DB, h consumer.Handler, store *buffered.Store) (*consumer.Metrics, func()) {
	t.Helper()
	cfg := consumer.Config{
		Name: "test", AMQPURL: b.url, Heartbeat: 2 * time.Second, Topology: b.topo,
		Prefetch: 4, Workers: 2, MaxAttempts: 2, PauseAfterFailures: -1, KeyTTL: keyTTL,
		ShutdownTimeout: 5 * time.Second, ReconnectMaxWait: time.Second,
		DatabaseCheck: func(ctx context.Context) error { return database.Ping(ctx, db) },
	}
	if store != nil {
		cfg.Buffered = &consumer.BufferedConfig{Store: store, MaxAttempts: 2,
			RetryDelays: []time.Duration{20 * time.Millisecond}, PollInterval: 100 * time.Millisecond, Lease: 3 * time.Second}
	}
	m := consumer.NewMetrics(prometheus.NewRegistry())
	rt, err := consumer.New(cfg, inbox.New(db, cfg.Name), h, 5*time.Second, m, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runtime: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("runtime did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	testenv.Eventually(t, 30*time.Second, "runtime ready", func() (bool, error) { return rt.Ready() == nil, nil })
	return m, stop
}

// A charge is taken, its response lost, and the retries fail until the
// message is dead-lettered (inline) or parked and exported (buffered). An
// operator replays it well within the allowed age, but the copy waits past
// the key lifetime (the service is down). The copy starts a fresh retry
// budget, yet it may have run: the runtime must refuse it with
// idempotency_key_expired instead of calling out again with a key the called
// service has forgotten, which would charge the card a second time.
//
// Also when the producer set no publish time: the replay's age limit counts
// from the dead-lettering then, and the kit's copies carry the time it first
// received the message, so that the guard can bound the copy's age too.
func TestReplayedCopyWaitingPastTheKeyLifetimeDoesNotCallOutAgain(t *testing.T) {
	for _, c := range []struct {
		mode      string
		published bool
	}{{"inline", true}, {"buffered", true}, {"inline", false}, {"buffered", false}} {
		mode := c.mode
		name := mode
		if !c.published {
			name += "/no publish time"
		}
		t.Run(name, func(t *testing.T) {
			b := newBroker(t)
			db, _ := testenv.MigratedDB(t, migrations.Inbox, migrations.Buffered)
			var store *buffered.Store
			if mode == "buffered" {
				store = buffered.New(db, "test")
			}
			calls := &outsideCalls{}
			calls.failing.Store(true)
			m, stop := runGuarded(t, b, db, calls, store)
			published := time.Now()
			ch := b.channel()
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			headers := amqp.Table{}
			if c.published {
				headers[wire.HeaderTimestampMillis] = published.UnixMilli()
			}
			if err := rabbit.PublishConfirmed(context.Background(), ch, b.topo.Exchange, b.topo.RoutingKey, amqp.Publishing{
				MessageId: "charged-once", ContentType: "application/json", DeliveryMode: amqp.Persistent,
				Headers: headers, Body: []byte(`{"order_id":"o-1"}`),
			}); err != nil {
				t.Fatal(err)
			}
			q := b.queue()
			if store == nil {
				b.waitDepth(b.topo.DeadLetterQueue, 1)
			} else {
				testenv.Eventually(t, 30*time.Second, "the message parked", func() (bool, error) {
					return m.Settled("test", consumer.OutcomeParked) == 1, nil
				})
			}
			stop() // the service is down from here on
			if store != nil {
				rep, err := q.Export(context.Background(), store, buffered.Selector{All: true}, false)
				if err != nil || len(rep.Exported) != 1 {
					t.Fatalf("export: %v, %d exported", err, len(rep.Exported))
				}
				b.waitDepth(b.topo.DeadLetterQueue, 1)
			}
			rep, err := q.Replay(context.Background(), Selector{All: true}, ReplayOptions{MaxReplays: 3, MaxAge: keyTTL})
			if err != nil || len(rep.Replayed) != 1 {
				t.Fatalf("replay within the key lifetime: %v, replayed %v", err, ids(rep.Replayed))
			}
			before := calls.n.Load()
			if before != 2 {
				t.Fatalf("%d outside calls before the replay, want 2 (two attempts)", before)
			}
			time.Sleep(time.Until(published.Add(keyTTL + 500*time.Millisecond))) // the copy waits past the lifetime

			calls.failing.Store(false)
			m, _ = runGuarded(t, b, db, calls, store)
			if store == nil {
				got := b.take(b.topo.DeadLetterQueue, 1)
				if r := got[0].Headers[wire.HeaderDeadLetterReason]; r != wire.ReasonKeyExpired {
					t.Errorf("dead-lettered with reason %v, want %s", r, wire.ReasonKeyExpired)
				}
			} else {
				testenv.Eventually(t, 30*time.Second, "the copy parked", func() (bool, error) {
					return m.Settled("test", consumer.OutcomeParked) == 1, nil
				})
				parked, err := store.ListParked(context.Background(), buffered.Selector{All: true}, 10)
				if err != nil || len(parked) != 1 || parked[0].Reason != string(wire.ReasonKeyExpired) {
					t.Errorf("parked %+v (%v), want the copy with reason %s", parked, err, wire.ReasonKeyExpired)
				}
			}
			if n := calls.n.Load(); n != before {
				t.Errorf("%d outside calls after the replay, want none: the copy ran as a first attempt with a forgotten key", n-before)
			}
			if n := m.Settled("test", consumer.OutcomeProcessed); n != 0 {
				t.Errorf("the copy was processed %d times", n)
			}
		})
	}
}

// A dead letter refused at the door (no message id, say) never ran: its
// replay carries no mark. Any other carries one, older dead letters without
// the mark included.
func TestReplayCopyMarksWhatMayHaveRun(t *testing.T) {
	cases := []struct {
		name    string
		headers amqp.Table
		want    bool
	}{
		{"refused at the door", amqp.Table{wire.HeaderDeadLetterReason: wire.ReasonUnsupportedContent, wire.HeaderAttempt: int32(1)}, false},
		{"marked", amqp.Table{wire.HeaderDeadLetterReason: wire.ReasonUnsupportedContent, wire.HeaderMayHaveRun: true}, true},
		{"retries exhausted", amqp.Table{wire.HeaderDeadLetterReason: wire.ReasonRetriesExhausted, wire.HeaderAttempt: int32(5)}, true},
		{"handler's permanent reason on the first attempt", amqp.Table{wire.HeaderDeadLetterReason: "gateway_rejected", wire.HeaderAttempt: int32(1)}, true},
		{"put back before", amqp.Table{wire.HeaderDeadLetterReason: wire.ReasonInvalidID, wire.HeaderHeld: int32(1)}, true},
		{"dead-lettered by the broker", amqp.Table{"x-death": []any{amqp.Table{"reason": "delivery_limit"}}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := replayCopy(amqp.Delivery{Headers: c.headers}, 1)
			if got := wire.MarkedAsRun(p.Headers); got != c.want {
				t.Errorf("marked %v, want %v", got, c.want)
			}
		})
	}
}
