package servicetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/ops"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/internal/servicetest"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// A ledger that consumes two events: an entry made, and an entry voided.
var voidsSchema = migrations.NewSet("voids", fstest.MapFS{"00001_voids.sql": {Data: []byte(
	"-- +goose Up\nCREATE TABLE voids (entry text PRIMARY KEY, had_entry boolean NOT NULL);\n-- +goose Down\nDROP TABLE voids;\n")}})

type voided struct {
	Entry string `json:"entry"`
}

type entryHandler struct{}

func (entryHandler) Handle(ctx context.Context, msg consumer.Message, e entry) (consumer.Writes, error) {
	return ledgerHandler(ctx, msg)
}

type voidHandler struct{}

// Handle records the void, and whether the entry was there when it came:
// in the buffered mode an entry's void comes after the entry.
func (voidHandler) Handle(_ context.Context, _ consumer.Message, v voided) (consumer.Writes, error) {
	return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		return consumer.OutcomeProcessed, tx.WithContext(ctx).Exec(
			`INSERT INTO voids (entry, had_entry) VALUES (?, EXISTS (SELECT 1 FROM ledger WHERE entry = ?))`, v.Entry, v.Entry).Error
	}, nil
}

// oneEvent is the ledger typed to its one event, entry.made.
func oneEvent() service.Options {
	opts := service.Options{
		Name: "ledger", Event: "entry-made", Exchange: "ledger", RoutingKey: "entry.made",
		Migrations: []migrations.Set{ledgerSchema, voidsSchema}, NoOutsideCalls: true,
	}
	return service.Consume(opts, consumer.Events[entry]{
		Decode: func(b []byte) (entry, error) {
			var e entry
			err := json.Unmarshal(b, &e)
			return e, err
		},
		OrderingKey: func(e entry) string { return e.Entry },
	}, func(*service.Kit) (entryHandler, error) { return entryHandler{}, nil })
}

// twoEvents is the ledger with its second event, entry.voided.
func twoEvents() service.Options {
	return service.ConsumeAlso(oneEvent(), rabbit.Binding{Key: "entry.voided"}, consumer.Events[voided]{
		Decode: func(b []byte) (voided, error) {
			var v voided
			if err := json.Unmarshal(b, &v); err != nil || v.Entry == "" {
				return v, errors.New("a void names its entry")
			}
			return v, nil
		},
		OrderingKey: func(v voided) string { return v.Entry },
	}, func(*service.Kit) (voidHandler, error) { return voidHandler{}, nil })
}

// A service that consumes two events binds its work queue to each, and each
// message reaches its own handler; in the buffered mode an entry's void,
// published right after the entry, is applied after it (one ordering key
// across the two events).
func TestAServiceConsumesTwoEvents(t *testing.T) {
	for _, mode := range []string{service.ModeInline, service.ModeBuffered} {
		t.Run(mode, func(t *testing.T) {
			s := servicetest.Start(t, twoEvents(), "INBOX_MODE="+mode)
			const n = 20
			for i := range n {
				e := "e-" + string(rune('a'+i))
				s.Publish(amqp.Publishing{MessageId: "made-" + e, Body: body(e, 10)})
				s.PublishTo("entry.voided", amqp.Publishing{MessageId: "void-" + e, Body: []byte(`{"entry":"` + e + `"}`)})
			}
			s.WaitOutcome(consumer.OutcomeProcessed, 2*n)
			if got := s.Count("SELECT count(*) FROM ledger"); got != n {
				t.Errorf("%d ledger rows, want %d", got, n)
			}
			if got := s.Count("SELECT count(*) FROM voids"); got != n {
				t.Errorf("%d voids, want %d", got, n)
			}
			if mode == service.ModeBuffered {
				if got := s.Count("SELECT count(*) FROM voids WHERE had_entry"); got != n {
					t.Errorf("%d of %d voids found their entry applied first", got, n)
				}
			}
		})
	}
}

// What would route a message two ways, or nowhere, refuses to start.
func TestAServiceRefusesEventsThatCollide(t *testing.T) {
	events := consumer.Events[voided]{Decode: func([]byte) (voided, error) { return voided{}, nil }}
	newVoid := func(*service.Kit) (voidHandler, error) { return voidHandler{}, nil }
	for _, tc := range []struct {
		name string
		opts service.Options
		env  []string
		want string
	}{
		{"before Consume", service.ConsumeAlso(ledger(), rabbit.Binding{Key: "entry.voided"}, events, newVoid), nil, "call Consume"},
		{"one event type twice", service.ConsumeAlso(twoEvents(), rabbit.Binding{Key: "entry.cancelled"}, events, newVoid), nil,
			"consumed with binding key \"entry.voided\" already"},
		{"ROUTING_KEY on another event's key", twoEvents(), []string{"ROUTING_KEY=entry.voided"}, "ROUTING_KEY"},
		{"ROUTING_KEY covering another event's key", twoEvents(), []string{"ROUTING_KEY=entry.*"}, "never reached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			_, err := service.LoadConfig(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadConfig: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// A further event's message that the broker dead-lettered itself (rejected
// without requeue: x-death, none of the kit's headers) and one the buffered
// inbox parked are replayed by the operators' commands to their own
// handler: the replayed copy comes back through the default exchange under
// the work queue's name, and carries where it was first published.
func TestAFurtherEventsDeadLetterIsReplayedToItsHandler(t *testing.T) {
	for _, mode := range []string{service.ModeInline, service.ModeBuffered} {
		t.Run(mode, func(t *testing.T) {
			s := servicetest.Start(t, twoEvents(), "INBOX_MODE="+mode)
			s.Publish(amqp.Publishing{MessageId: "made-e-1", Body: body("e-1", 10)})
			s.WaitOutcome(consumer.OutcomeProcessed, 1)
			s.Stop()
			// Published while the service is away, then rejected by hand:
			// the broker dead-letters it with its x-death alone.
			s.PublishTo("entry.voided", amqp.Publishing{MessageId: "void-e-1", Body: []byte(`{"entry":"e-1"}`)})
			testenv.WithChannel(t, s.AMQPURL, func(ch *amqp.Channel) error {
				for {
					d, ok, err := ch.Get(s.Config.Queue, false)
					if err != nil {
						return err
					}
					if ok {
						return d.Reject(false)
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
			// The broker dead-letters it on its own time (at least once,
			// from a quorum queue): the replay must find it there.
			testenv.Eventually(t, 30*time.Second, "the rejected void in the dead-letter queue", func() (bool, error) {
				n := 0
				testenv.WithChannel(t, s.AMQPURL, func(ch *amqp.Channel) error {
					q, err := ch.QueueDeclarePassive(s.Config.DeadLetterQueue, true, false, false, false, nil)
					n = q.Messages
					return err
				})
				return n == 1, nil
			})
			env := []string{"INBOX_MODE=" + mode, "AMQP_URL=" + s.AMQPURL, "DATABASE_URL=" + s.DBURL}
			// The operator sees which event it is.
			var list bytes.Buffer
			if err := ops.Run(context.Background(), twoEvents(), []string{"dlq", "list", "--json"}, nil, &list); err != nil ||
				!strings.Contains(list.String(), `"routing_key": "entry.voided"`) {
				t.Errorf("dlq list --json: %v, want the void's routing key:\n%s", err, list.String())
			}
			var out bytes.Buffer
			if err := ops.Run(context.Background(), twoEvents(), []string{"dlq", "replay", "--all"}, nil, &out); err != nil ||
				!strings.Contains(out.String(), "1 replayed") {
				t.Fatalf("dlq replay --all: %v\n%s", err, out.String())
			}
			again := servicetest.Start(t, twoEvents(), env...)
			again.WaitOutcome(consumer.OutcomeProcessed, 1)
			if n := again.Count("SELECT count(*) FROM voids WHERE entry = 'e-1'"); n != 1 {
				t.Errorf("%d voids of e-1 after the replay, want 1", n)
			}
			if dead := again.DeadLetters(); len(dead) != 0 {
				t.Errorf("dead letters after the replay: %v", dead)
			}
		})
	}
}

// A service of one event is routed too: a message that reaches its queue
// through a binding it does not declare (left by a release that removed an
// event, or made by a newer replica in a rollout that adds one) is
// dead-lettered invalid_event, naming its key, not taken for its event;
// one published straight to the queue (its origin unknown) is its event's.
func TestAMessageOfABindingNotDeclaredIsRefused(t *testing.T) {
	s := servicetest.Start(t, oneEvent())
	testenv.WithChannel(t, s.AMQPURL, func(ch *amqp.Channel) error {
		return ch.QueueBind(s.Config.Queue, "entry.voided", s.Config.Exchange, false, nil) // a release before had it
	})
	s.PublishTo("entry.voided", amqp.Publishing{MessageId: "void-e-1", Body: []byte(`{"entry":"e-1","amount":1}`)})
	testenv.Publish(t, s.AMQPURL, "", s.Config.Queue, amqp.Publishing{MessageId: "made-e-2", Body: body("e-2", 10)})
	s.WaitOutcome(consumer.OutcomeProcessed, 1)
	dead := map[string]string{}
	testenv.Eventually(t, 30*time.Second, "the void dead-lettered", func() (bool, error) {
		for id, reason := range s.DeadLetters() {
			dead[id] = reason
		}
		return len(dead) > 0, nil
	})
	if len(dead) != 1 || dead["void-e-1"] != "invalid_event" {
		t.Errorf("dead letters %v, want void-e-1 invalid_event", dead)
	}
	if n := s.Count("SELECT count(*) FROM ledger"); n != 1 {
		t.Errorf("%d ledger rows, want e-2's alone", n)
	}
}
