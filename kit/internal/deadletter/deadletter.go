// Package deadletter operates one consumer's dead-letter queue: it lists the
// messages waiting there without losing them, replays chosen ones to the work
// queue with a fresh retry budget, and purges the queue.
package deadletter

import (
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Queue is a consumer's dead-letter queue (Topology.DeadLetterQueue) and the
// work queue its messages are replayed to (Topology.Queue). It declares
// nothing: the service owns the topology, and an operator's tool that declared
// queues could create them with the wrong arguments.
type Queue struct {
	conn  *amqp.Connection
	topo  rabbit.Topology
	attrs func(body []byte) []slog.Attr
}

// New operates the dead-letter queue of topo over conn. attrs, the service's
// log attributes (an order id, say), describe each message's body in listings;
// nil shows none.
func New(conn *amqp.Connection, topo rabbit.Topology, attrs func(body []byte) []slog.Attr) *Queue {
	return &Queue{conn: conn, topo: topo, attrs: attrs}
}

// Name is the dead-letter queue's name.
func (q *Queue) Name() string { return q.topo.DeadLetterQueue }

// Depth is the number of messages ready in the dead-letter queue.
func (q *Queue) Depth() (int, error) {
	ch, err := q.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return depth(ch, q.topo.DeadLetterQueue)
}

// Purge removes every ready message from the dead-letter queue and returns how
// many it removed. Messages another client holds unacked at that moment stay.
func (q *Queue) Purge() (int, error) {
	ch, err := q.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if _, err := depth(ch, q.topo.DeadLetterQueue); err != nil {
		return 0, err
	}
	n, err := ch.QueuePurge(q.topo.DeadLetterQueue, false)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", q.topo.DeadLetterQueue, err)
	}
	return n, nil
}

// depth checks that queue exists and returns its ready messages. A missing
// queue closes ch, so callers open a fresh channel for anything after an error.
func depth(ch *amqp.Channel, queue string) (int, error) {
	st, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %s (has the service declared its topology in this vhost?): %w", queue, err)
	}
	return st.Messages, nil
}
