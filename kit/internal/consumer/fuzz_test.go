package consumer

import (
	"mime"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// FuzzAdmit: what the runtime trusts in a delivery's properties and headers
// (message id, content type, x-attempt, x-death, the publish time) never
// panics it, and a delivery it admits has a dedupe key the inbox and the
// broker can hold and an attempt count of at least 1 that only the runtime's
// own retry path raised.
func FuzzAdmit(f *testing.F) {
	f.Add("m-1", "application/json", "payments.order-placed.retry.1s", int64(3), int64(1764417600000), []byte(`{}`))
	f.Add("", "application/json; charset=utf-8", "", int64(0), int64(0), []byte(`{"id":"from-body"}`))
	f.Add("m\x00", "text/plain", "other.queue", int64(-1), int64(-5), []byte(`{}`))
	f.Add(strings.Repeat("x", 300), "application/json;;", "payments.order-placed.retry.", int64(1<<40), int64(1<<62), []byte{0xff})
	f.Add("\xffid", "", "payments.order-placed.retry.5s", int64(2), int64(0), []byte(`{"id":`))
	r := assemble(&Runtime{cfg: Config{
		Topology:     rabbit.Topology{Queue: "payments.order-placed"},
		MaxBodyBytes: 64, ContentTypes: []string{"application/json"}, // small: the fuzzer's bodies reach it
		KeyFromBody: func(b []byte) string {
			s := string(b)
			if i := strings.Index(s, `"id":"`); i >= 0 {
				s = s[i+6:]
				if j := strings.IndexByte(s, '"'); j >= 0 {
					return s[:j]
				}
			}
			return ""
		},
	}})
	f.Fuzz(func(t *testing.T, id, contentType, deathQueue string, attempt, publishedMs int64, body []byte) {
		d := amqp.Delivery{MessageId: id, ContentType: contentType, Body: body, Headers: amqp.Table{
			wire.HeaderAttempt:         attempt,
			wire.HeaderTimestampMillis: publishedMs,
			"x-death":                  []any{amqp.Table{"queue": deathQueue, "count": attempt}},
		}}
		msg := r.door.received(d) // as both modes take a delivery
		if msg.Attempt < 1 {
			t.Fatalf("attempt %d", msg.Attempt)
		}
		if msg.Attempt > 1 && !strings.HasPrefix(deathQueue, "payments.order-placed.retry.") {
			t.Fatalf("attempt %d trusted from a delivery that never went through a retry queue (x-death %q)", msg.Attempt, deathQueue)
		}
		reason, err := r.door.admit(d, &msg)
		if !reason.isZero() {
			if err == nil {
				t.Fatalf("reason %q without an error", reason)
			}
			return
		}
		// The rules, stated here apart from the code they check: an AMQP
		// short string, UTF-8 without control characters; a body within 64
		// bytes; a JSON media type or none.
		if msg.ID == "" || len(msg.ID) > 255 || !utf8.ValidString(msg.ID) || strings.ContainsFunc(msg.ID, unicode.IsControl) {
			t.Fatalf("admitted the dedupe key %q", msg.ID)
		}
		if len(body) > 64 {
			t.Fatalf("admitted a body of %d bytes", len(body))
		}
		if contentType != "" {
			if mt, _, err := mime.ParseMediaType(contentType); err != nil || mt != "application/json" {
				t.Fatalf("admitted the content type %q", contentType)
			}
		}
	})
}
