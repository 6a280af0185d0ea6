package verify

import (
	"context"
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/deadletter"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// amqpBroker reads queue depths and dead letters over one connection.
type amqpBroker struct {
	conn *amqp.Connection
	dlq  *deadletter.Queue
}

// NewBroker returns the Broker of a connection; it leaves every message in
// place. attrs are the payment service's log attributes: they name each dead
// letter's order (order_id).
func NewBroker(conn *amqp.Connection, topo rabbit.Topology, attrs func(body []byte) []slog.Attr) Broker {
	return &amqpBroker{conn: conn, dlq: deadletter.New(conn, topo, attrs)}
}

func (b *amqpBroker) Depth(queue string) (int, error) {
	ch, err := b.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %s: %w", queue, err)
	}
	return q.Messages, nil
}

func (b *amqpBroker) DeadLetters(ctx context.Context) ([]deadletter.Message, error) {
	n, err := b.dlq.Depth()
	if err != nil || n == 0 {
		return nil, err
	}
	l, err := b.dlq.List(ctx, n)
	return l.Messages, err
}
