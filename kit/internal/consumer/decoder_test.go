package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/wire"
)

// decodedEvent is the event of the Decoder tests: what the ordering tests
// publish, with an id of its own for messages without a message_id.
type decodedEvent struct {
	ID  string `json:"id"`
	Key string `json:"key"`
	N   int    `json:"n"`
}

// countingEvents decodes decodedEvent bodies, counting the decodes, and
// refuses a negative n with a reason of its own.
func countingEvents(decodes *atomic.Int64) Events[decodedEvent] {
	return Events[decodedEvent]{
		Decode: func(body []byte) (decodedEvent, error) {
			decodes.Add(1)
			var ev decodedEvent
			if err := json.Unmarshal(body, &ev); err != nil {
				return ev, err // not a PermanentError: wire.ReasonInvalidEvent
			}
			if ev.N < 0 {
				return ev, Permanent(NewReason("negative_n"), fmt.Errorf("n is %d", ev.N))
			}
			return ev, nil
		},
		ID:          func(e decodedEvent) string { return e.ID },
		OrderingKey: func(e decodedEvent) string { return e.Key },
	}
}

// eventHandler applies each decoded event in the table ordered, reading it
// from msg.Event only.
func eventHandler() Handler {
	return HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
		ev, err := EventOf[decodedEvent](msg)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
			return OutcomeProcessed, tx.Exec(`INSERT INTO ordered (key, n, message_id) VALUES (?, ?, ?)`, ev.Key, ev.N, msg.ID).Error
		}, nil
	})
}

// A Decoder decodes each body once per run: the handler gets the event, the
// dedupe key of a message without a message_id comes from it, and so does
// the buffered mode's ordering key (order per key kept with no OrderingKey
// function). A body it refuses reaches no handler: dead-lettered inline,
// parked buffered, with the Decoder's reason, or invalid_event for an error
// that gives none.
func TestDecoderDecodesEachBodyOnce(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		var decodes atomic.Int64
		keys := []string{"a", "b", "c"}
		const perKey = 10
		for n := range perKey {
			for _, k := range keys {
				body, _ := json.Marshal(decodedEvent{ID: fmt.Sprintf("ev-%s-%d", k, n), Key: k, N: n})
				// Every other message has no message_id: the event's id is its key.
				id := ""
				if n%2 == 0 {
					id = fmt.Sprintf("ev-%s-%d", k, n)
				}
				e.publish(id, string(body))
			}
		}
		e.publish("bad-json", `{"key": "a", "n": `)
		e.publish("negative", `{"key": "b", "n": -1}`)
		rt := e.start(eventHandler(), func(c *Config) {
			m.config(e.db, e.dbURL, func(b *BufferedConfig) { b.OrderingKey = nil })(c)
			c.Decoder, c.KeyFromBody = countingEvents(&decodes), nil
		})
		got := m.givenUp(e, 2)
		if len(got) != 2 {
			t.Fatalf("given up on %d messages, want the two refused bodies: %+v", len(got), got)
		}
		for _, g := range got {
			want := map[string]string{"bad-json": wire.ReasonInvalidEvent, "negative": "negative_n"}[g.id]
			if g.reason != want {
				t.Errorf("%s given up with reason %q, want %q (%s)", g.id, g.reason, want, g.err)
			}
		}
		waitFor(t, "every valid event applied", func() bool { return e.appliedTotal() == len(keys)*perKey })
		if m.orderPerKey {
			e.assertInOrder(keys, perKey)
		}
		var ids []string
		if err := e.db.Raw(`SELECT message_id FROM ordered ORDER BY message_id`).Scan(&ids).Error; err != nil {
			t.Fatal(err)
		}
		if len(ids) != len(keys)*perKey || slices.Contains(ids, "") {
			t.Errorf("applied under ids %v: want every event under its message_id or its own id", ids)
		}
		// Inline: one decode per delivery. Buffered: one at ingest, one to
		// process (the stored message is decoded again).
		deliveries := int64(len(keys)*perKey + 2)
		want := deliveries
		if m.buffered() {
			want = 2 * deliveries
		}
		if n := decodes.Load(); n != want {
			t.Errorf("%d decodes for %d deliveries, want %d", n, deliveries, want)
		}
		rt.shutdown(t)
	})
}

// A handler that returns nil writes and no error says nothing of its
// outcome: the message is refused (writes_without_outcome) and nothing of it
// commits, as for writes that return no outcome. NoWrites names one.
func TestNilWritesAreRefused(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		e.publish("nil-writes", `{"key": "a", "n": 1}`)
		e.publish("no-writes", `{"key": "b", "n": 1}`)
		rt := e.start(HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
			if msg.ID == "no-writes" {
				return NoWrites(OutcomeDuplicate), nil
			}
			return nil, nil
		}), m.config(e.db, e.dbURL, nil))
		got := m.givenUp(e, 1)
		if len(got) != 1 || got[0].id != "nil-writes" || got[0].reason != wire.ReasonNoOutcome {
			t.Fatalf("given up on %+v, want nil-writes with %s", got, wire.ReasonNoOutcome)
		}
		waitFor(t, "the NoWrites message counted a duplicate", func() bool { return rt.count(OutcomeDuplicate) == 1 })
		var inbox int64
		if err := e.db.Raw(`SELECT count(*) FROM inbox WHERE message_id = 'no-writes'`).Scan(&inbox).Error; err != nil {
			t.Fatal(err)
		}
		if inbox != 1 {
			t.Errorf("the NoWrites message has %d inbox rows, want 1", inbox)
		}
		rt.shutdown(t)
	})
}

// A Decoder that panics never crashes a replica: the body is refused as an
// invalid event (dead-lettered inline, parked buffered), the panic counted,
// and the next message is processed. In the buffered mode that holds too for
// a panic only when a stored message is decoded again (a Decoder changed by
// a release since the ingest). A message with no message_id whose body the
// Decoder refuses is dead-lettered with the Decoder's reason, not as
// missing its id.
func TestDecoderPanicsAndRefusalsNeverCrashAReplica(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		var decodes atomic.Int64
		events := countingEvents(&decodes)
		var secondDecodes atomic.Int64
		decode := events.Decode
		events.Decode = func(body []byte) (decodedEvent, error) {
			switch {
			case strings.Contains(string(body), "boom"):
				panic("the decoder cannot take it")
			case strings.Contains(string(body), "second") && secondDecodes.Add(1) > 1:
				panic("the decoder changed since the ingest")
			}
			return decode(body)
		}
		e.publish("boom", `{"key": "boom", "n": 1}`)
		e.publish("", `{"key": "a", "n": -1}`) // no message_id, and a body the Decoder refuses
		if m.buffered() {
			e.publish("second", `{"id": "second", "key": "second", "n": 1}`)
		}
		e.publish("valid", `{"key": "a", "n": 1}`)
		rt := e.start(eventHandler(), func(c *Config) {
			m.config(e.db, e.dbURL, func(b *BufferedConfig) { b.OrderingKey = nil })(c)
			c.Decoder, c.KeyFromBody = events, nil
		})
		waitFor(t, "the valid message applied after the panics", func() bool { return e.appliedTotal() == 1 })
		// Inline, all three refusals are dead letters; buffered, the refusal
		// without an id is dead-lettered at the door and the panics parked.
		wantDead, wantParked := 2, 0
		if m.buffered() {
			wantDead, wantParked = 1, 2
		}
		reasons := map[string]string{}
		for _, d := range e.deadLetters(wantDead) {
			reasons[d.MessageId] = fmt.Sprint(d.Headers[wire.HeaderDeadLetterReason])
		}
		if wantParked > 0 {
			for _, g := range m.givenUp(e, wantParked) {
				reasons[g.id] = g.reason
			}
		}
		want := map[string]string{"boom": wire.ReasonInvalidEvent, "": "negative_n"}
		if m.buffered() {
			want["second"] = wire.ReasonInvalidEvent
		}
		if fmt.Sprint(reasons) != fmt.Sprint(want) {
			t.Errorf("given up on %v, want %v", reasons, want)
		}
		if n := counterValue(rt.metrics.panics.WithLabelValues(rt.cfg.Name)); n < len(want)-1 {
			t.Errorf("%d panics counted, want at least %d", n, len(want)-1)
		}
		if err := rt.Ready(); err != nil {
			t.Errorf("the replica is not ready after the decoder's panics: %v", err)
		}
		rt.shutdown(t)
	})
}

// A body the Decoder refuses, published without a message_id, is
// dead-lettered at once in either mode with the Decoder's reason, and under
// the id the body names wherever the Decoder could read it (the event it
// returned with its refusal): on the copy as its message_id and on the log
// line, so that dlq list shows it and dlq replay --id reaches it. An id that
// is no id (a NUL in it) is left off, and the reason stays the Decoder's.
func TestRefusedBodyKeepsItsReadableID(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		var decodes atomic.Int64
		rt := e.start(eventHandler(), func(c *Config) {
			m.config(e.db, e.dbURL, func(b *BufferedConfig) { b.OrderingKey = nil })(c)
			c.Decoder, c.KeyFromBody = countingEvents(&decodes), nil
		})
		e.publish("", `{"id": "ev-negative", "key": "a", "n": -1}`)
		e.publish("", `{"id": "ev-\u0000", "key": "b", "n": -1}`)
		e.publish("", `{"id": "ev-valid", "key": "a", "n": 1}`)
		reasons := map[string]string{}
		for _, d := range e.deadLetters(2) {
			reasons[d.MessageId] = fmt.Sprint(d.Headers[wire.HeaderDeadLetterReason])
		}
		if want := map[string]string{"ev-negative": "negative_n", "": "negative_n"}; fmt.Sprint(reasons) != fmt.Sprint(want) {
			t.Errorf("dead letters %v, want %v", reasons, want)
		}
		waitFor(t, "the valid event applied", func() bool { return e.appliedTotal() == 1 })
		if !loggedFor(rt.logs.String(), "message dead-lettered", "ev-negative") {
			t.Errorf("no dead-lettering logged with message_id ev-negative:\n%s", rt.logs)
		}
	})
}

// loggedFor reports whether logs hold a JSON line with msg about message id.
func loggedFor(logs, msg, id string) bool {
	for line := range strings.Lines(logs) {
		var l struct {
			Msg       string `json:"msg"`
			MessageID string `json:"message_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.MessageID == id {
			return true
		}
	}
	return false
}
