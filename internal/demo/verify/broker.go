package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit"
)

// DeadLetter is a dead letter (or a parked message) as the service's `dlq
// list --json` shows it: its id, its reason and the service's log attributes
// of its body (order_id).
type DeadLetter struct {
	ID     string            `json:"message_id"`
	Attrs  map[string]string `json:"attributes,omitempty"`
	Reason string            `json:"reason"`
}

// amqpBroker reads queue depths over one connection, and the dead letters
// with the service's own operations command.
type amqpBroker struct {
	conn *amqp.Connection
	svc  kit.Service
	dlq  string
}

// NewBroker returns the Broker of a connection and of svc, whose dead-letter
// queue is dlq; it leaves every message in place. svc's operations commands
// read the configuration from the environment, as the caller read it.
func NewBroker(conn *amqp.Connection, svc kit.Service, dlq string) Broker {
	return &amqpBroker{conn: conn, svc: svc, dlq: dlq}
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

// DeadLetters lists the whole dead-letter queue with `dlq list --json`, which
// gives every message back to the queue.
func (b *amqpBroker) DeadLetters(ctx context.Context) ([]DeadLetter, error) {
	n, err := b.Depth(b.dlq)
	if err != nil || n == 0 {
		return nil, err
	}
	var out bytes.Buffer
	if err := kit.Operate(ctx, b.svc, []string{"dlq", "list", "--json", "--limit", strconv.Itoa(n)}, nil, &out); err != nil {
		return nil, fmt.Errorf("dlq list: %w", err)
	}
	var l struct {
		Messages []DeadLetter `json:"messages"`
	}
	if err := json.Unmarshal(out.Bytes(), &l); err != nil {
		return nil, fmt.Errorf("dlq list --json: %w", err)
	}
	return l.Messages, nil
}
