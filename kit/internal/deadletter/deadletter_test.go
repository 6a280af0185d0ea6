package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// broker is one test's vhost with the consumer's topology declared.
type broker struct {
	t    *testing.T
	url  string
	conn *amqp.Connection
	topo rabbit.Topology
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	b := &broker{t: t, url: testenv.VHost(t), topo: rabbit.Topology{
		Exchange: "orders", RoutingKey: "order.placed", Queue: "work", DeadLetterExchange: "dlx",
		DeadLetterQueue: "work.dlq", DeliveryLimit: 20,
		RetryDelays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
	}}
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b.conn = conn
	if err := b.topo.Declare(b.channel()); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *broker) channel() *amqp.Channel {
	b.t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { ch.Close() })
	return ch
}

func (b *broker) queue() *Queue { return New(b.conn, b.topo, orderAttrs) }

// orderAttrs stands for a service's log attributes: the body's order_id.
func orderAttrs(body []byte) []slog.Attr {
	var v struct {
		OrderID string `json:"order_id"`
	}
	if json.Unmarshal(body, &v) != nil || v.OrderID == "" {
		return nil
	}
	return []slog.Attr{slog.String("order_id", v.OrderID)}
}

// deadLetter is a message as the runtime dead-letters it.
type deadLetter struct {
	id, orderID, reason string
	attempts, replays   int
}

// published is the AMQP timestamp put gives every dead letter: two hours ago,
// in whole seconds as the property carries it.
var published = time.Now().Add(-2 * time.Hour).Truncate(time.Second)

// keyLifetime is the replay age limit of the tests: a day.
const keyLifetime = 24 * time.Hour

// put publishes dl to the dead-letter exchange with the headers the runtime's
// dead-lettering writes (kit/internal/consumer/settle.go).
func (b *broker) put(dls ...deadLetter) {
	b.t.Helper()
	for _, dl := range dls {
		b.publishDead(b.deadPublishing(dl))
	}
}

// publishDead publishes p to the dead-letter exchange with a confirm.
func (b *broker) publishDead(p amqp.Publishing) {
	b.t.Helper()
	ch := b.channel()
	if err := ch.Confirm(false); err != nil {
		b.t.Fatal(err)
	}
	if err := rabbit.PublishConfirmed(context.Background(), ch, b.topo.DeadLetterExchange, b.topo.DeadLetterKey(), p); err != nil {
		b.t.Fatal(err)
	}
}

// deadPublishing is dl as the runtime dead-letters it.
func (b *broker) deadPublishing(dl deadLetter) amqp.Publishing {
	h := amqp.Table{
		wire.HeaderDeadLetterReason: dl.reason,
		wire.HeaderDeadLetterError:  "last: gateway answered 503",
		wire.HeaderDeadLetteredAt:   time.Now().Add(-90 * time.Minute).UTC().Format(time.RFC3339Nano),
		wire.HeaderDeadLetterBy:     "test",
		wire.HeaderAttempt:          int32(dl.attempts),
		wire.HeaderFirstError:       "first: gateway timeout",
		wire.HeaderLastError:        "last: gateway answered 503",
		wire.HeaderOriginalExchange: b.topo.Exchange,
		wire.HeaderOriginalKey:      b.topo.RoutingKey,
		"x-custom":                  "kept",
	}
	if dl.replays > 0 {
		h[HeaderReplayCount] = int32(dl.replays)
	}
	return amqp.Publishing{
		MessageId: dl.id, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		CorrelationId: "corr-" + dl.id, Type: "OrderPlaced", AppId: "order-publisher",
		Timestamp: published, Headers: h,
		Body: fmt.Appendf(nil, `{"event_id":%q,"order_id":%q}`, dl.id, dl.orderID),
	}
}

// waitDepth waits until queue holds n ready messages: messages returned by a
// closed channel reach the queue shortly after the close.
func (b *broker) waitDepth(queue string, n int) {
	b.t.Helper()
	ch := b.channel()
	testenv.Eventually(b.t, 30*time.Second, fmt.Sprintf("%d messages in %s", n, queue), func() (bool, error) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages == n, err
	})
}

// take consumes exactly n messages from queue.
func (b *broker) take(queue string, n int) []amqp.Delivery {
	b.t.Helper()
	b.waitDepth(queue, n)
	ch := b.channel()
	var got []amqp.Delivery
	for range n {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			b.t.Fatalf("get from %s: ok=%v err=%v", queue, ok, err)
		}
		got = append(got, d)
	}
	return got
}

func ids(ms []Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

func TestListShowsMessagesAndLeavesThem(t *testing.T) {
	b := newBroker(t)
	b.put(deadLetter{"m-1", "o-1", "retries_exhausted", 5, 0},
		deadLetter{"m-2", "o-2", "malformed_json", 1, 2},
		deadLetter{"m-3", "o-3", "gateway_rejected", 1, 0})
	b.waitDepth(b.topo.DeadLetterQueue, 3)

	l, err := b.queue().List(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if l.Depth != 3 || len(l.Messages) != 3 {
		t.Fatalf("listing %+v, want 3 of 3", l)
	}
	got := l.Messages[0]
	want := Message{ID: "m-1", Attrs: map[string]string{"order_id": "o-1"}, Exchange: "orders", RoutingKey: "order.placed", Reason: "retries_exhausted", Attempts: 5,
		FirstError: "first: gateway timeout", Since: published, AgeFrom: AgeFromTimestamp}
	if got.DeadLetteredAt.IsZero() || time.Since(got.DeadLetteredAt) < 89*time.Minute {
		t.Errorf("dead-lettered at %s, want 90 minutes ago", got.DeadLetteredAt)
	}
	if age := got.Age(time.Now()); age < 2*time.Hour || age > 3*time.Hour {
		t.Errorf("age %s, want two hours: since its publish time", age)
	}
	got.DeadLetteredAt = time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("first message %+v, want %+v", got, want)
	}
	if l.Messages[1].Replays != 2 {
		t.Errorf("second message shows %d replays, want 2", l.Messages[1].Replays)
	}
	b.waitDepth(b.topo.DeadLetterQueue, 3)

	l, err = b.queue().List(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if l.Depth != 3 || len(l.Messages) != 2 {
		t.Fatalf("with limit 2: %d of %d, want 2 of 3", len(l.Messages), l.Depth)
	}
	b.waitDepth(b.topo.DeadLetterQueue, 3)
	b.waitDepth(b.topo.Queue, 0)
}

// Every listing returns its messages, and a quorum queue would count each
// return: more listings than RabbitMQ 4's default quorum delivery limit (20)
// must still lose nothing.
func TestListingRepeatedlyKeepsMessages(t *testing.T) {
	b := newBroker(t)
	b.put(deadLetter{"m-1", "o-1", "retries_exhausted", 5, 0})
	for i := range 25 {
		b.waitDepth(b.topo.DeadLetterQueue, 1)
		l, err := b.queue().List(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Messages) != 1 {
			t.Fatalf("listing %d shows %d messages, want 1", i+1, len(l.Messages))
		}
	}
	b.waitDepth(b.topo.DeadLetterQueue, 1)
}

// A crash loop ends with RabbitMQ dead-lettering the message itself: no headers
// of ours, only x-death.
func TestListShowsBrokerDeadLetters(t *testing.T) {
	b := newBroker(t)
	b.topo.DeliveryLimit = 2
	b.topo.Queue, b.topo.DeadLetterQueue = "loop", "loop.dlq"
	if err := b.topo.Declare(b.channel()); err != nil {
		t.Fatal(err)
	}
	ch := b.channel()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if err := rabbit.PublishConfirmed(context.Background(), ch, "", "loop", amqp.Publishing{MessageId: "crashy", Body: []byte(`{"order_id":"o-9"}`)}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the broker to dead-letter a crash loop", func() (bool, error) {
		if d, ok, err := ch.Get("loop", false); err != nil {
			return false, err
		} else if ok {
			// basic.reject with requeue counts against the limit on every version.
			return false, d.Reject(true)
		}
		q, err := ch.QueueDeclarePassive("loop.dlq", true, false, false, false, nil)
		return err == nil && q.Messages == 1, err
	})
	l, err := b.queue().List(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Messages) != 1 {
		t.Fatalf("listing %+v, want the dead-lettered message", l)
	}
	m := l.Messages[0]
	if m.ID != "crashy" || m.Attrs["order_id"] != "o-9" || m.Reason != "delivery_limit" || m.DeadLetteredAt.IsZero() {
		t.Errorf("message %+v, want crashy, o-9, reason delivery_limit and a time from x-death", m)
	}
}

func TestReplayByIDMovesExactlyThatMessage(t *testing.T) {
	b := newBroker(t)
	b.put(deadLetter{"m-1", "o-1", "retries_exhausted", 5, 0},
		deadLetter{"m-2", "o-2", "retries_exhausted", 5, 0},
		deadLetter{"m-3", "o-3", "malformed_json", 1, 0})
	b.waitDepth(b.topo.DeadLetterQueue, 3)

	rep, err := b.queue().Replay(context.Background(), Selector{ID: "m-2"}, ReplayOptions{MaxReplays: 3, MaxAge: keyLifetime})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Replayed) != 1 || rep.Replayed[0].ID != "m-2" || rep.Replayed[0].Replays != 1 || rep.Skipped != 2 || rep.Visited != 3 {
		t.Fatalf("report %+v, want m-2 replayed once and 2 skipped of 3 visited", rep)
	}
	d := b.take(b.topo.Queue, 1)[0]
	if d.MessageId != "m-2" || string(d.Body) != `{"event_id":"m-2","order_id":"o-2"}` {
		t.Errorf("replayed %q with body %s, want m-2 as published", d.MessageId, d.Body)
	}
	if d.ContentType != "application/json" || d.CorrelationId != "corr-m-2" || d.Type != "OrderPlaced" ||
		d.AppId != "order-publisher" || !d.Timestamp.Equal(published) || d.DeliveryMode != amqp.Persistent {
		t.Errorf("properties not kept: %+v", d)
	}
	if n, ok := d.Headers[HeaderReplayCount].(int32); !ok || n != 1 {
		t.Errorf("%s = %#v, want int32 1", HeaderReplayCount, d.Headers[HeaderReplayCount])
	}
	for _, h := range resetHeaders {
		if h == "x-delivery-count" || h == "x-acquired-count" {
			continue // the work queue's own counters, set by the broker on delivery
		}
		if v, ok := d.Headers[h]; ok {
			t.Errorf("header %s = %v survived the replay", h, v)
		}
	}
	for h, want := range map[string]string{"x-custom": "kept", wire.HeaderOriginalExchange: "orders"} {
		if d.Headers[h] != want {
			t.Errorf("header %s = %v, want %q", h, d.Headers[h], want)
		}
	}
	b.waitDepth(b.topo.DeadLetterQueue, 2)
}

func TestReplaySelectsAndCaps(t *testing.T) {
	tests := []struct {
		name         string
		sel          Selector
		dryRun       bool
		wantReplayed []string
		wantRefused  []string
		wantSkipped  int
		wantLeft     int // in the dead-letter queue afterwards
	}{
		{name: "by reason", sel: Selector{Reason: "retries_exhausted"},
			wantReplayed: []string{"fresh"}, wantRefused: []string{"capped"}, wantSkipped: 1, wantLeft: 2},
		{name: "all; the one at the cap stays", sel: Selector{All: true},
			wantReplayed: []string{"fresh", "poison"}, wantRefused: []string{"capped"}, wantLeft: 1},
		{name: "dry run changes nothing", sel: Selector{All: true}, dryRun: true,
			wantReplayed: []string{"fresh", "poison"}, wantRefused: []string{"capped"}, wantLeft: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBroker(t)
			b.put(deadLetter{"fresh", "o-1", "retries_exhausted", 5, 2},
				deadLetter{"capped", "o-2", "retries_exhausted", 5, 3},
				deadLetter{"poison", "o-3", "malformed_json", 1, 0})
			b.waitDepth(b.topo.DeadLetterQueue, 3)

			rep, err := b.queue().Replay(context.Background(), tt.sel, ReplayOptions{MaxReplays: 3, MaxAge: keyLifetime, DryRun: tt.dryRun})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(ids(rep.Replayed)) != fmt.Sprint(tt.wantReplayed) || fmt.Sprint(ids(rep.Refused)) != fmt.Sprint(tt.wantRefused) ||
				rep.Skipped != tt.wantSkipped || rep.Visited != 3 {
				t.Fatalf("replayed %v, refused %v, skipped %d, visited %d; want %v, %v, %d, 3",
					ids(rep.Replayed), ids(rep.Refused), rep.Skipped, rep.Visited, tt.wantReplayed, tt.wantRefused, tt.wantSkipped)
			}
			b.waitDepth(b.topo.DeadLetterQueue, tt.wantLeft)
			if tt.dryRun {
				b.waitDepth(b.topo.Queue, 0)
				l, err := b.queue().List(context.Background(), 10)
				if err != nil {
					t.Fatal(err)
				}
				if l.Messages[0].ID != "fresh" || l.Messages[0].Replays != 2 {
					t.Errorf("a dry run changed a message: %+v", l.Messages[0])
				}
				return
			}
			for _, d := range b.take(b.topo.Queue, len(tt.wantReplayed)) {
				if d.MessageId == "fresh" && d.Headers[HeaderReplayCount] != int32(3) {
					t.Errorf("fresh: %s = %v, want 3", HeaderReplayCount, d.Headers[HeaderReplayCount])
				}
			}
			for _, d := range b.take(b.topo.DeadLetterQueue, tt.wantLeft) {
				if d.MessageId == "capped" && d.Headers[HeaderReplayCount] != int32(3) {
					t.Errorf("the refused message was changed: %v", d.Headers)
				}
			}
		})
	}
}

func TestReplayOfAMissingWorkQueueMovesNothing(t *testing.T) {
	b := newBroker(t)
	b.put(deadLetter{"m-1", "o-1", "retries_exhausted", 5, 0})
	topo := b.topo
	topo.Queue = "no-such-queue"
	if _, err := New(b.conn, topo, nil).Replay(context.Background(), Selector{All: true}, ReplayOptions{MaxReplays: 3, MaxAge: keyLifetime}); err == nil {
		t.Fatal("replay to a missing work queue succeeded")
	}
	b.waitDepth(b.topo.DeadLetterQueue, 1)

	// Should the queue vanish after that check, the broker returns the copy
	// instead of confirming it as stored.
	pub, err := rabbit.NewPublisher(b.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(context.Background(), "", "no-such-queue", amqp.Publishing{Body: []byte("{}")}); !errors.Is(err, rabbit.ErrReturned) {
		t.Fatalf("a publish no queue took: err %v, want ErrReturned", err)
	}
	if err := pub.Publish(context.Background(), "", b.topo.Queue, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatalf("the publisher is unusable after a return: %v", err)
	}
}

func TestPurge(t *testing.T) {
	b := newBroker(t)
	b.put(deadLetter{"m-1", "o-1", "malformed_json", 1, 0}, deadLetter{"m-2", "o-2", "malformed_json", 1, 0})
	b.waitDepth(b.topo.DeadLetterQueue, 2)
	q := b.queue()
	if n, err := q.Depth(); err != nil || n != 2 {
		t.Fatalf("depth %d, %v; want 2", n, err)
	}
	n, err := q.Purge()
	if err != nil || n != 2 {
		t.Fatalf("purged %d, %v; want 2", n, err)
	}
	b.waitDepth(b.topo.DeadLetterQueue, 0)
}

func TestSelectorValidate(t *testing.T) {
	tests := []struct {
		sel   Selector
		valid bool
	}{
		{Selector{}, false},
		{Selector{ID: "m-1"}, true},
		{Selector{Reason: "malformed_json"}, true},
		{Selector{All: true}, true},
		{Selector{ID: "m-1", All: true}, false},
		{Selector{ID: "m-1", Reason: "x"}, false},
	}
	for _, tt := range tests {
		if err := tt.sel.Validate(); (err == nil) != tt.valid {
			t.Errorf("%+v: err = %v, want valid=%v", tt.sel, err, tt.valid)
		}
	}
}

// A dead letter older than the replay's age limit is refused and stays, unless
// forced: its age counts from the publish time (the timestamp_in_ms header,
// else the AMQP timestamp), else from the dead-lettering; a message of unknown
// age is refused too.
func TestReplayRefusesMessagesOlderThanMaxAge(t *testing.T) {
	day := time.Now().Add(-25 * time.Hour)
	tests := []struct {
		name    string
		change  func(p *amqp.Publishing)
		old     bool
		ageFrom string
	}{
		{"young", func(*amqp.Publishing) {}, false, AgeFromTimestamp},
		{"old by its timestamp", func(p *amqp.Publishing) { p.Timestamp = day }, true, AgeFromTimestamp},
		{"old by timestamp_in_ms, young by its timestamp", func(p *amqp.Publishing) {
			p.Headers[wire.HeaderTimestampMillis] = day.UnixMilli()
		}, true, AgeFromPublishMillis},
		{"young by timestamp_in_ms, old by its timestamp", func(p *amqp.Publishing) {
			p.Timestamp = day
			p.Headers[wire.HeaderTimestampMillis] = time.Now().UnixMilli()
		}, false, AgeFromPublishMillis},
		{"no publish time, dead-lettered long ago", func(p *amqp.Publishing) {
			p.Timestamp = time.Time{}
			p.Headers[wire.HeaderDeadLetteredAt] = day.UTC().Format(time.RFC3339Nano)
		}, true, AgeFromDeadLettered},
		{"no publish time, dead-lettered lately", func(p *amqp.Publishing) { p.Timestamp = time.Time{} }, false, AgeFromDeadLettered},
		{"no time at all", func(p *amqp.Publishing) {
			p.Timestamp = time.Time{}
			delete(p.Headers, wire.HeaderDeadLetteredAt)
		}, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBroker(t)
			p := b.deadPublishing(deadLetter{"m-1", "o-1", "retries_exhausted", 5, 0})
			tt.change(&p)
			b.publishDead(p)
			b.waitDepth(b.topo.DeadLetterQueue, 1)

			opts := ReplayOptions{MaxReplays: 3, MaxAge: keyLifetime}
			rep, err := b.queue().Replay(context.Background(), Selector{All: true}, opts)
			if err != nil {
				t.Fatal(err)
			}
			if tooOld, replayed := len(rep.TooOld) == 1, len(rep.Replayed) == 1; tooOld != tt.old || replayed == tt.old {
				t.Fatalf("replayed %v, too old %v; want too old: %v", ids(rep.Replayed), ids(rep.TooOld), tt.old)
			}
			m := append(rep.Replayed, rep.TooOld...)[0]
			if m.AgeFrom != tt.ageFrom {
				t.Errorf("age from %q, want %q", m.AgeFrom, tt.ageFrom)
			}
			if !tt.old {
				b.take(b.topo.Queue, 1)
				b.waitDepth(b.topo.DeadLetterQueue, 0)
				return
			}
			b.waitDepth(b.topo.DeadLetterQueue, 1)
			b.waitDepth(b.topo.Queue, 0)

			opts.Force = true
			rep, err = b.queue().Replay(context.Background(), Selector{All: true}, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Replayed) != 1 || len(rep.Forced) != 1 || len(rep.TooOld) != 0 {
				t.Fatalf("forced: replayed %v, forced %v, too old %v; want the message replayed and forced",
					ids(rep.Replayed), ids(rep.Forced), ids(rep.TooOld))
			}
			b.take(b.topo.Queue, 1)
			b.waitDepth(b.topo.DeadLetterQueue, 0)
		})
	}
}

func TestReplayNeedsAnAgeLimit(t *testing.T) {
	b := newBroker(t)
	if _, err := b.queue().Replay(context.Background(), Selector{All: true}, ReplayOptions{MaxReplays: 3}); err == nil {
		t.Fatal("a replay without an age limit ran")
	}
}

// A list, a dry run and a replay run one right after the other see the
// same dead letters: each gives back what it held before it returns. Before,
// each gave them back by closing its channel, and a quorum queue makes
// returned messages ready a moment later: the next command counted fewer
// ready messages and visited only those ("0 replayed" after a list).
func TestCommandsRightAfterEachOtherSeeEveryDeadLetter(t *testing.T) {
	b := newBroker(t)
	const n = 30
	for i := range n {
		b.put(deadLetter{fmt.Sprintf("m-%d", i), fmt.Sprintf("o-%d", i), "retries_exhausted", 5, 0})
	}
	b.waitDepth(b.topo.DeadLetterQueue, n)
	q := b.queue()
	for round := range 5 {
		l, err := q.List(context.Background(), n)
		if err != nil || l.Depth != n || len(l.Messages) != n {
			t.Fatalf("round %d: list: depth %d, %d messages (%v), want %d", round, l.Depth, len(l.Messages), err, n)
		}
		rep, err := q.Replay(context.Background(), Selector{All: true}, ReplayOptions{MaxReplays: 3, NoAgeLimit: true, DryRun: true})
		if err != nil || rep.Depth != n || len(rep.Replayed) != n {
			t.Fatalf("round %d: the dry run right after the list: depth %d, %d would be replayed (%v), want %d", round, rep.Depth, len(rep.Replayed), err, n)
		}
	}
	// A replay gives back what it did not replay: the list right after it
	// sees the rest.
	rep, err := q.Replay(context.Background(), Selector{ID: "m-0"}, ReplayOptions{MaxReplays: 3, NoAgeLimit: true})
	if err != nil || len(rep.Replayed) != 1 {
		t.Fatalf("the replay of m-0 right after a dry run: %d replayed of depth %d (%v), want 1", len(rep.Replayed), rep.Depth, err)
	}
	if l, err := q.List(context.Background(), n); err != nil || l.Depth != n-1 {
		t.Fatalf("the list right after the replay of m-0: depth %d (%v), want %d", l.Depth, err, n-1)
	}
	rep, err = q.Replay(context.Background(), Selector{All: true}, ReplayOptions{MaxReplays: 3, NoAgeLimit: true})
	if err != nil || len(rep.Replayed) != n-1 {
		t.Fatalf("the replay right after the list: %d replayed of depth %d (%v), want %d", len(rep.Replayed), rep.Depth, err, n-1)
	}
}
