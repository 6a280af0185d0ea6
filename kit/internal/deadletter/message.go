package deadletter

import (
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// Headers of ours, in addition to the consumer runtime's.
const (
	// HeaderReplayCount counts the replays of a message out of the dead-letter
	// queue. The runtime copies it into every retry and dead-letter copy, so it
	// survives the next dead-lettering, and a message at the cap is refused:
	// a replay can never loop.
	HeaderReplayCount = "x-replay-count"
	HeaderReplayedAt  = "x-replayed-at"
)

// Message is what an operator sees of a dead letter.
type Message struct {
	ID             string            `json:"message_id"`
	Attrs          map[string]string `json:"attributes,omitempty"`  // the service's log attributes of the body
	Exchange       string            `json:"exchange,omitempty"`    // where the message was published ("" unknown):
	RoutingKey     string            `json:"routing_key,omitempty"` // a service of several events routes it by them
	Reason         string            `json:"reason"`
	Attempts       int               `json:"attempts"`
	FirstError     string            `json:"first_error,omitempty"`
	DeadLetteredAt time.Time         `json:"dead_lettered_at,omitzero"`
	Replays        int               `json:"replays"`
	// Since is when the message's age counts from, AgeFrom where it was read
	// (one of the AgeFrom constants; "" when nothing tells).
	Since   time.Time `json:"since,omitzero"`
	AgeFrom string    `json:"age_from,omitempty"`
}

// Where a dead letter's age counts from, best first. The publish time bounds
// the message's first attempt, and so the age of the idempotency keys of its
// outside calls, from above: a message is not handled before it is published.
// Without one the dead-lettering time is all there is, and it understates the
// age by the time the message spent in its retries (and, for a message
// replayed before, by everything before its last dead-lettering).
const (
	AgeFromPublishMillis = wire.HeaderTimestampMillis // the header our producers and RabbitMQ's timestamp plugin set
	AgeFromTimestamp     = "timestamp"                // the AMQP timestamp property, whole seconds
	AgeFromDeadLettered  = wire.HeaderDeadLetteredAt  // the runtime's dead-lettering time
	AgeFromDeath         = "x-death"                  // the broker's, for the messages it dead-lettered itself
)

// Age is how long ago the message was published (or, failing that,
// dead-lettered: see AgeFrom), or 0 if unknown.
func (m Message) Age(now time.Time) time.Duration {
	if m.Since.IsZero() {
		return 0
	}
	return now.Sub(m.Since)
}

// Published reports whether the age counts from the publish time.
func (m Message) Published() bool {
	return m.AgeFrom == AgeFromPublishMillis || m.AgeFrom == AgeFromTimestamp
}

// OlderThan reports whether the message is older than maxAge, or of unknown
// age: the services its handler calls may have forgotten its idempotency keys.
func (m Message) OlderThan(maxAge time.Duration, now time.Time) bool {
	return m.Since.IsZero() || m.Age(now) > maxAge
}

// describe reads a dead letter's headers. Messages the runtime dead-lettered
// carry our headers; those RabbitMQ dead-lettered itself (a crash loop past
// the work queue's delivery limit) carry only the broker's x-death.
func describe(d amqp.Delivery, attrs func(body []byte) []slog.Attr) Message {
	h := d.Headers
	m := Message{
		ID:         d.MessageId,
		Attrs:      bodyAttrs(d.Body, attrs),
		Reason:     stringHeader(h, wire.HeaderDeadLetterReason),
		Attempts:   intHeader(h, wire.HeaderAttempt),
		FirstError: stringHeader(h, wire.HeaderFirstError),
		Replays:    intHeader(h, HeaderReplayCount),
	}
	if m.FirstError == "" {
		m.FirstError = stringHeader(h, wire.HeaderDeadLetterError)
	}
	var known bool
	if m.Exchange, m.RoutingKey, known = rabbit.HeaderOrigin(h); !known {
		m.Exchange, m.RoutingKey, _ = rabbit.DeathOrigin(h)
	}
	if at, err := time.Parse(time.RFC3339Nano, stringHeader(h, wire.HeaderDeadLetteredAt)); err == nil {
		m.DeadLetteredAt, m.Since, m.AgeFrom = at, at, AgeFromDeadLettered
	}
	if death, ok := lastDeath(h); ok {
		if m.Reason == "" {
			m.Reason, _ = death["reason"].(string)
		}
		if t, ok := death["time"].(time.Time); ok && m.DeadLetteredAt.IsZero() {
			m.DeadLetteredAt, m.Since, m.AgeFrom = t, t, AgeFromDeath
		}
	}
	switch ms := intHeader(h, wire.HeaderTimestampMillis); {
	case ms > 0:
		m.Since, m.AgeFrom = time.UnixMilli(int64(ms)), AgeFromPublishMillis
	case d.Timestamp.Unix() > 0:
		m.Since, m.AgeFrom = d.Timestamp, AgeFromTimestamp
	}
	return m
}

// bodyAttrs renders the service's log attributes of a body; a body they
// cannot read shows none.
func bodyAttrs(body []byte, attrs func(body []byte) []slog.Attr) map[string]string {
	if attrs == nil {
		return nil
	}
	out := map[string]string{}
	for _, a := range attrs(body) {
		out[a.Key] = a.Value.String()
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// AttrsText renders the attributes as key=value pairs in key order.
func (m Message) AttrsText() string {
	keys := slices.Sorted(maps.Keys(m.Attrs))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m.Attrs[k]
	}
	return strings.Join(parts, " ")
}

// lastDeath is the broker's record of the dead-lettering that put the message
// here: x-death lists the newest first.
func lastDeath(h amqp.Table) (amqp.Table, bool) {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return nil, false
	}
	death, ok := deaths[0].(amqp.Table)
	return death, ok
}

func stringHeader(h amqp.Table, key string) string {
	s, _ := h[key].(string)
	return s
}

func intHeader(h amqp.Table, key string) int {
	switch v := h[key].(type) {
	case int8:
		return int(v)
	case int16:
		return int(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	case int:
		return v
	}
	return 0
}
