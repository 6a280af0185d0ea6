package consumer

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/wire"
)

// From an outside review: a message whose properties and headers nearly
// fill a frame (frame_max, 128 KiB) arrives whole, but the runtime's copy of
// it (its dead letter, a retry, a hold) adds headers and no longer fits: the
// broker closed the publishing connection on the copy (501 FRAME_ERROR), the
// session ended with every message in flight, the delivery came back and the
// same happened again, until the work queue's delivery limit had the broker
// dead-letter it (with x-death, too big then for a client to read). Now such
// a message is refused before it runs, dead-lettered headers_too_large with
// the producer's headers left out, and the connection stays.
func TestMessageWhoseCopyCannotFitAFrameIsDeadLetteredWithoutItsHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rt := e.start(recordHandler(func(msg Message) error { return nil }), nil)
	e.publish("bad-1", `{}`, func(p *amqp.Publishing) {
		p.Headers = amqp.Table{"note": strings.Repeat("x", 130_850)}
	})
	e.publish("good-1", `{}`)
	testenv.Eventually(t, time.Minute, "the message in the dead-letter queue, the other applied", func() (bool, error) {
		return e.queueDepth(e.topo.DeadLetterQueue) == 1 && rt.count(OutcomeProcessed) == 1, nil
	})
	if n := testutil.ToFloat64(rt.metrics.reconnects.WithLabelValues(rt.cfg.Name)); n != 0 {
		t.Errorf("the runtime reconnected %v times for one message too large to copy", n)
	}
	testenv.WithChannel(t, e.url, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get(e.topo.DeadLetterQueue, true)
		if err != nil || !ok {
			t.Fatalf("get the dead letter: %v %v", ok, err)
		}
		if d.MessageId != "bad-1" || d.Headers[wire.HeaderDeadLetterReason] != wire.ReasonHeadersTooLarge || d.Headers["note"] != nil {
			t.Errorf("dead letter %q with reason %v (note kept: %v), want bad-1, %s, without the producer's headers",
				d.MessageId, d.Headers[wire.HeaderDeadLetterReason], d.Headers["note"] != nil, wire.ReasonHeadersTooLarge)
		}
		if n, _ := d.Headers[wire.HeaderHeadersDropped].(int64); n < 130_850 {
			t.Errorf("%s = %v, want the size left out", wire.HeaderHeadersDropped, d.Headers[wire.HeaderHeadersDropped])
		}
		return nil
	})
}
