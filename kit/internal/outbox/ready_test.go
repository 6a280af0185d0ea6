package outbox

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// The relay's readiness follows the broker's block of its connection as it
// is when asked: blocked while the alarm lasts, ready again at its end,
// whatever the session loop was doing when the unblock came. Before, the loop
// wrote the block into the relay's state and cleared it only when its own
// wait took the unblock: a wake-up (the poll, a NOTIFY) taken first, with
// the unblock before the next look, left the relay not ready for good.
func TestRelayReadinessFollowsTheBrokersBlock(t *testing.T) {
	r, err := NewRelay(RelayConfig{AMQPURL: "amqp://guest:guest@127.0.0.1:5672/"}, nil, nil, nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.Ready() == nil {
		t.Fatal("a relay that never connected is ready")
	}
	r.setState("") // as a session does once connected
	notes := make(chan amqp.Blocking)
	r.blocked.Store(amqpsession.FollowBlocked(notes, nil))
	if err := r.Ready(); err != nil {
		t.Fatalf("connected and not blocked: %v", err)
	}
	readyIs := func(want error) func() bool {
		return func() bool { return errors.Is(r.Ready(), want) }
	}
	notes <- amqp.Blocking{Active: true, Reason: "low on memory"}
	eventually(t, "the relay reports the block", 10*time.Second, readyIs(errBlocked))
	notes <- amqp.Blocking{Active: false}
	eventually(t, "the relay is ready after the unblock", 10*time.Second, readyIs(nil))
	notes <- amqp.Blocking{Active: true, Reason: "low on disk"}
	eventually(t, "the relay reports the second block", 10*time.Second, readyIs(errBlocked))
	close(notes) // the connection closed: no longer blocked (the session's end says why it is not ready)
	eventually(t, "the relay is not blocked once the connection closed", 10*time.Second, readyIs(nil))
}
