package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
)

// Listing is a look at the head of the dead-letter queue.
type Listing struct {
	Depth    int       // messages ready in the queue when the listing began
	Messages []Message // the first of them, at most the limit
}

// List shows up to limit messages from the head of the dead-letter queue and
// leaves every one of them there.
//
// AMQP 0-9-1 cannot browse a queue, so List takes the messages with basic.get
// without auto-ack on a channel of its own and then closes that channel
// without acking: the broker returns every one of them to the queue. That is
// not free, and an operator should know it:
//   - the returned messages are marked redelivered, and their order may change
//     (a classic queue puts them back in place; a quorum queue delivers
//     returned messages first);
//   - a quorum queue counts each return in the message's x-delivery-count, and
//     past an x-delivery-limit it drops or dead-letters the message. The
//     dead-letter queue is a quorum queue whose limit no listing reaches
//     (rabbit.DeadLetterDeliveryLimit), where RabbitMQ 4.x would set 20 by
//     default (TestListingRepeatedlyKeepsMessages looks 25 times).
//
// Closing the channel returns them all in one step, and also when List fails
// halfway or the process dies: no path acks a listed message. List returns
// once they are ready again (giveBack), so that a command run right after
// it sees them.
func (q *Queue) List(ctx context.Context, limit int) (Listing, error) {
	if limit < 1 {
		return Listing{}, errors.New("list: limit must be at least 1")
	}
	ch, err := q.conn.Channel()
	if err != nil {
		return Listing{}, fmt.Errorf("open channel: %w", err)
	}
	var l Listing
	// Returns every message taken below to the queue, ready again before
	// List returns.
	defer func() { q.giveBack(ctx, ch, len(l.Messages)) }()
	if l.Depth, err = depth(ch, q.topo.DeadLetterQueue); err != nil {
		return l, err
	}
	for len(l.Messages) < min(limit, l.Depth) {
		if err := ctx.Err(); err != nil {
			return l, err
		}
		d, ok, err := ch.Get(q.topo.DeadLetterQueue, false)
		if err != nil {
			return l, fmt.Errorf("get from %s: %w", q.topo.DeadLetterQueue, err)
		}
		if !ok {
			break
		}
		l.Messages = append(l.Messages, describe(d, q.attrs))
	}
	return l, nil
}

// giveBack closes ch, on which held dead letters were taken and not acked,
// so that the broker returns them to the queue, and waits until the queue
// shows them ready again: a quorum queue applies the returns a moment after
// the close, and a list or replay run right after would count fewer ready
// messages and visit only those. AMQP offers no barrier for it (a nack, a
// recover and a passive declare are all answered before the returns are
// applied), so the depth is polled, for at most giveBackWait or until ctx
// ends: dead letters arriving meanwhile may end the wait early, and another
// dlq command holding some may make it last that long, both harmless.
func (q *Queue) giveBack(ctx context.Context, ch *amqp.Channel, held int) {
	if held == 0 {
		_ = ch.Close()
		return
	}
	// The held ones are not ready. (A quorum queue's count that took the
	// broker over 250 ms reads 0: the wait may then end early, the next
	// command seeing fewer, as without it.)
	before, err := depth(ch, q.topo.DeadLetterQueue)
	_ = ch.Close()
	if err != nil {
		return
	}
	look, err := q.conn.Channel()
	if err != nil {
		return
	}
	defer func() { _ = look.Close() }()
	deadline := time.Now().Add(giveBackWait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		n, err := depth(look, q.topo.DeadLetterQueue)
		if err != nil || n >= before+held {
			return
		}
		if !amqpsession.Sleep(ctx, 10*time.Millisecond) {
			return
		}
	}
}

// giveBackWait bounds giveBack's wait.
const giveBackWait = 5 * time.Second
