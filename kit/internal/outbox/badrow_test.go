package outbox

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// One bad row costs that row alone, wherever it sits in a batch: it spends
// its attempts and is parked with its reason, every good row is sent
// without spending one, and the relay keeps its connection. Before, a row
// the broker closed the channel on (404, 403) had the first row of the batch
// still without a confirm charged in its place (with quorum queues, usually
// a good one that came before it), and a row with a name over AMQP's 255
// bytes made the client library close the connection: the relay gave the
// batch back and reconnected, forever.
func TestABadRowIsParkedWhereverItSitsInTheBatch(t *testing.T) {
	const batch = 5
	kinds := []struct {
		name   string
		reason string
		// add commits the bad row (some bad rows Enqueue would refuse: they
		// are written as an earlier version of the kit could have).
		add func(t *testing.T, e *env)
	}{
		{"404 no such exchange", ReasonRefused, func(t *testing.T, e *env) {
			if _, err := e.emit(nil, Message{Exchange: "not-declared", RoutingKey: key, Body: []byte(`{"bad":true}`)}); err != nil {
				t.Fatal(err)
			}
		}},
		{"403 no permission", ReasonRefused, func(t *testing.T, e *env) {
			if _, err := e.emit(nil, Message{Exchange: "forbidden", RoutingKey: key, Body: []byte(`{"bad":true}`)}); err != nil {
				t.Fatal(err)
			}
		}},
		{"routing key over 255 bytes", ReasonInvalid, func(t *testing.T, e *env) {
			e.insertRaw(t, exchange, strings.Repeat("k", 300), `{}`)
		}},
		{"nested header name over 255 bytes", ReasonInvalid, func(t *testing.T, e *env) {
			e.insertRaw(t, exchange, key, `{"outer": {"`+strings.Repeat("h", 256)+`": 1}}`)
		}},
		// The properties and headers travel in one frame (frame_max, 128 KiB):
		// the broker closes the whole connection on a bigger one (501).
		{"headers over one frame", ReasonInvalid, func(t *testing.T, e *env) {
			e.insertRaw(t, exchange, key, `{"note": "`+strings.Repeat("x", 200<<10)+`"}`)
		}},
	}
	for _, kind := range kinds {
		for _, pos := range []struct {
			name string
			at   int
		}{{"first", 0}, {"middle", batch / 2}, {"last", batch - 1}} {
			t.Run(kind.name+"/"+pos.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				denyWritesTo(t, e.amqp, "forbidden")
				for i := range batch {
					if i == pos.at {
						kind.add(t, e)
						continue
					}
					if _, err := e.emit(nil, event(i, "")); err != nil {
						t.Fatal(err)
					}
				}
				r, m, _ := e.relay(e.amqp, func(c *RelayConfig) { c.Batch = batch })
				eventually(t, "the bad row parked after its attempts, every good row sent", time.Minute, func() bool {
					return e.count("status = 'parked' AND park_reason = ?", kind.reason) == 1 &&
						e.count("status = 'sent'") == batch-1
				})
				if n := e.count("attempts > 0 AND status <> 'parked'"); n != 0 {
					t.Errorf("%d good rows were charged an attempt", n)
				}
				if n := e.count("status = 'parked'"); n != 1 {
					t.Errorf("%d rows parked, want the bad one only", n)
				}
				if kind.reason == ReasonRefused {
					if n := e.count("status = 'parked' AND attempts = 3"); n != 1 {
						t.Errorf("the bad row was not charged each of its 3 attempts")
					}
				}
				got := map[string]bool{}
				for _, d := range e.received(batch - 1) {
					got[d.MessageId] = true
				}
				if len(got) != batch-1 {
					t.Errorf("received %d distinct good rows, want %d", len(got), batch-1)
				}
				if n := testutil.ToFloat64(m.reconnects.WithLabelValues("producer")); n != 0 {
					t.Errorf("the relay reconnected %v times for one bad row", n)
				}
				if err := r.Ready(); err != nil {
					t.Errorf("relay not ready after one bad row: %v", err)
				}
			})
		}
	}
}

// insertRaw commits a row as Enqueue does not write it, headers as stored.
func (e *env) insertRaw(t *testing.T, exchange, routingKey, headers string) {
	t.Helper()
	if err := e.db.Exec(`INSERT INTO outbox (id, producer, exchange, routing_key, content_type, headers, body)
		VALUES (gen_random_uuid(), 'producer', ?, ?, 'application/json', ?::jsonb, '{}')`, exchange, routingKey, headers).Error; err != nil {
		t.Fatal(err)
	}
}

// denyWritesTo declares exchange in the vhost of amqpURL, bound to the
// downstream queue, and takes the right to publish to it from the test's
// user: a publish there is refused with 403.
func denyWritesTo(t *testing.T, amqpURL, exchange string) {
	t.Helper()
	testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(queue, key, exchange, false, nil)
	})
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	testenv.SetPermissions(t, strings.TrimPrefix(u.Path, "/"), u.User.Username(), ".*", "^(?!"+exchange+"$).*", ".*")
}

// Enqueue refuses a message AMQP could not carry, naming what is too long,
// instead of leaving a row that would never go out.
func TestEnqueueRefusesWhatAMQPCannotCarry(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("x", 256)
	for _, c := range []struct {
		name string
		msg  Message
		want string
	}{
		{"routing key", Message{Exchange: exchange, RoutingKey: long}, "routing key"},
		{"exchange", Message{Exchange: long, RoutingKey: key}, "exchange"},
		{"content type", Message{Exchange: exchange, RoutingKey: key, ContentType: long}, "content type"},
		{"header name", Message{Exchange: exchange, RoutingKey: key, Headers: map[string]any{long: 1}}, "header name"},
		{"header name in a table", Message{Exchange: exchange, RoutingKey: key,
			Headers: map[string]any{"a": map[string]any{"b": amqp.Table{long: 1}}}}, "header name a.b."},
		{"header name in an array", Message{Exchange: exchange, RoutingKey: key,
			Headers: map[string]any{"a": []any{1, map[string]any{long: 1}}}}, "header name a.[1]."},
		{"header name of NULs, three bytes each once stored", Message{Exchange: exchange, RoutingKey: key,
			Headers: map[string]any{strings.Repeat("\x00", 100): 1}}, "300 bytes"},
		{"headers over 64 KiB", Message{Exchange: exchange, RoutingKey: key,
			Headers: map[string]any{"note": strings.Repeat("x", 64<<10)}}, "frame"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.msg.Body = []byte(`{}`)
			_, err := e.emit(nil, c.msg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Enqueue: %v, want an error naming %q", err, c.want)
			}
		})
	}
	// At the limit, and with no body at all (an empty message, not a NULL).
	edge := strings.Repeat("y", 255)
	if _, err := e.emit(nil, Message{Exchange: exchange, RoutingKey: edge, ContentType: edge, Headers: map[string]any{edge: edge}}); err != nil {
		t.Fatalf("Enqueue refused names of 255 bytes: %v", err)
	}
	if n := e.count("true"); n != 1 {
		t.Fatalf("%d rows in the outbox, want the one of names at the limit", n)
	}
}

// A parked row that can never be published (invalid: retry only parks it
// again) has a way out: Skip deletes it, hands it back as it was, and moves
// its key on, so that the key's later rows are published. From an outside
// review: before, an invalid head blocked its key for good.
func TestSkippingAParkedHeadLetsItsKeyGoOn(t *testing.T) {
	e := newEnv(t)
	ids, err := e.emit(nil, event(0, "k"), event(1, "k"), event(2, "k"))
	if err != nil {
		t.Fatal(err)
	}
	// The head as an earlier version could have written it: too long a key.
	if err := e.db.Exec(`UPDATE outbox SET routing_key = repeat('r', 300) WHERE id = ?`, ids[0]).Error; err != nil {
		t.Fatal(err)
	}
	e.relay(e.amqp, nil)
	eventually(t, "the head parked invalid", 30*time.Second, func() bool {
		return e.count("id = ? AND status = 'parked' AND park_reason = ?", ids[0], ReasonInvalid) == 1
	})
	if n, err := e.store.Retry(context.Background(), ids[0]); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	eventually(t, "parked again after retry", 30*time.Second, func() bool {
		return e.count("id = ? AND status = 'parked'", ids[0]) == 1
	})
	if _, err := e.store.Skip(context.Background(), ids[1]); !errors.Is(err, ErrNotParked) {
		t.Fatalf("skip of a row that is not parked: %v, want ErrNotParked", err)
	}
	k, err := e.store.Skip(context.Background(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if k.ID != ids[0] || k.OrderingKey != "k" || k.Seq != 1 || k.Reason != ReasonInvalid || len(k.Body) == 0 {
		t.Errorf("skipped %+v, want the head as it was", k)
	}
	got := e.received(2)
	if len(got) != 2 || got[0].MessageId != ids[1] || got[1].MessageId != ids[2] {
		t.Fatalf("after the skip, received %d rows, want the key's two others in order", len(got))
	}
	if n := e.count("true"); n != 2 {
		t.Errorf("%d rows left, want the two sent", n)
	}
}
