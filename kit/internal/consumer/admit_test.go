package consumer

import (
	"strings"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

func TestAdmitResolvesTheKeyOrNamesTheReason(t *testing.T) {
	t.Parallel()
	r := assemble(&Runtime{cfg: Config{Name: "t", AMQPURL: "amqp://x"}})
	r.cfg.KeyFromBody = func(b []byte) string {
		if s, ok := strings.CutPrefix(string(b), "id:"); ok {
			return s
		}
		return ""
	}
	r.cfg.setDefaults()
	r.cfg.MaxBodyBytes = 64
	tests := []struct {
		name       string
		d          amqp.Delivery
		wantKey    string
		wantReason Reason
	}{
		{"message_id property wins", amqp.Delivery{MessageId: "m1", Body: []byte("id:b1")}, "m1", Reason{}},
		{"body id when no property", amqp.Delivery{Body: []byte("id:b1")}, "b1", Reason{}},
		{"no id anywhere", amqp.Delivery{Body: []byte("{}")}, "", reasonMissingID},
		{"body id too long", amqp.Delivery{Body: []byte("id:" + strings.Repeat("x", 60))}, "", Reason{}},
		{"json with charset", amqp.Delivery{MessageId: "m2", ContentType: "application/json; charset=utf-8"}, "m2", Reason{}},
		{"empty content type is JSON", amqp.Delivery{MessageId: "m3"}, "m3", Reason{}},
		{"text/plain", amqp.Delivery{MessageId: "m4", ContentType: "text/plain"}, "m4", reasonUnsupportedContent},
		{"garbled content type", amqp.Delivery{MessageId: "m5", ContentType: "application/"}, "m5", reasonUnsupportedContent},
		{"too large", amqp.Delivery{MessageId: "m6", Body: make([]byte, 65)}, "m6", reasonBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := message(tt.d)
			reason, _ := r.door.admit(tt.d, &msg)
			if reason != tt.wantReason || (tt.wantKey != "" && msg.ID != tt.wantKey) {
				t.Fatalf("admit = key %q, reason %q; want key %q, reason %q", msg.ID, reason, tt.wantKey, tt.wantReason)
			}
		})
	}
	long := amqp.Delivery{Body: []byte("id:" + strings.Repeat("x", 300))}
	r.cfg.MaxBodyBytes = 1024
	msg := message(long)
	if reason, _ := r.door.admit(long, &msg); reason != reasonInvalidID || msg.ID != "" {
		t.Fatalf("a 300-byte body id: reason %q, id %q; want %s and no id on the copy", reason, msg.ID, wire.ReasonInvalidID)
	}
}

func TestAttemptComesFromOurHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		headers amqp.Table
		want    int
	}{
		{nil, 1},
		{amqp.Table{wire.HeaderAttempt: int32(3)}, 3},
		{amqp.Table{wire.HeaderAttempt: int64(4)}, 4},
		{amqp.Table{wire.HeaderAttempt: "5"}, 1}, // not ours: ignored
		{amqp.Table{"x-death": []any{amqp.Table{"count": int64(9)}}}, 1},
	}
	for _, tt := range tests {
		if got := message(amqp.Delivery{Headers: tt.headers}).Attempt; got != tt.want {
			t.Errorf("headers %v: attempt %d, want %d", tt.headers, got, tt.want)
		}
	}
}

// A producer's x-pause-holds is not ours: only a delivery back from one of
// our delay queues carries a hold count the runtime wrote, and a copy the
// runtime makes carries the count it trusts, not the producer's.
func TestPauseHoldsComeFromOurDelayQueues(t *testing.T) {
	t.Parallel()
	r := assemble(&Runtime{cfg: Config{Topology: rabbit.Topology{Queue: "work"}}})
	fromRetry := amqp.Table{wire.HeaderPauseHolds: int32(4), "x-death": []any{amqp.Table{"queue": "work.retry.50ms"}}}
	if got := r.door.received(amqp.Delivery{Headers: fromRetry}).holds; got != 4 {
		t.Errorf("back from a delay queue: %d holds, want 4", got)
	}
	fresh := amqp.Delivery{Headers: amqp.Table{wire.HeaderPauseHolds: int32(1000)}}
	msg := r.door.received(fresh)
	if msg.holds != 0 {
		t.Errorf("a producer's header: %d holds, want 0", msg.holds)
	}
	if _, ok := republish(fresh, msg).Headers[wire.HeaderPauseHolds]; ok {
		t.Error("the producer's hold count survived on the runtime's copy")
	}
}

// A body the Decoder refuses keeps the id it names, where that is an id: the
// dead letter and the log line carry it. With no message_id property the
// refusal is the reason at once; with one, the property is the id and the
// refusal is left for the mode (dead-lettered inline, parked buffered).
func TestAdmitKeepsTheIDOfARefusedBody(t *testing.T) {
	t.Parallel()
	r := assemble(&Runtime{cfg: Config{Name: "t", AMQPURL: "amqp://x"}})
	var decodes atomic.Int64
	r.cfg.Decoder = countingEvents(&decodes)
	r.cfg.setDefaults()
	tests := []struct {
		name, property, body string
		wantID               string
		wantReason           Reason
	}{
		{"refused, its id readable", "", `{"id": "ev-1", "n": -1}`, "ev-1", kitReason("negative_n")},
		{"refused, its id a NUL", "", `{"id": "ev-\u0000", "n": -1}`, "", kitReason("negative_n")},
		{"refused, its id too long", "", `{"id": "` + strings.Repeat("x", 256) + `", "n": -1}`, "", kitReason("negative_n")},
		{"refused, no id", "", `{"n": -1}`, "", kitReason("negative_n")},
		{"malformed", "", `{"id": "ev-2", `, "", ReasonInvalidEvent},
		{"refused under a property", "m-1", `{"id": "ev-3", "n": -1}`, "m-1", Reason{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := amqp.Delivery{MessageId: tt.property, Body: []byte(tt.body)}
			msg := r.door.received(d)
			reason, _ := r.door.admit(d, &msg)
			if msg.ID != tt.wantID || reason != tt.wantReason || msg.undecoded == nil {
				t.Errorf("admit = id %q, reason %q (refusal %v); want id %q, reason %q", msg.ID, reason, msg.undecoded, tt.wantID, tt.wantReason)
			}
		})
	}
}
