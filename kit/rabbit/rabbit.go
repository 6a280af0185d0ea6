// Package rabbit holds the RabbitMQ plumbing shared by the programs: dialing with
// heartbeats, the consumer's topology and publishing with publisher confirms.
package rabbit

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNotConfirmed means the broker refused a publish (basic.nack) or the channel
// closed before it answered: the message may not be stored.
var ErrNotConfirmed = errors.New("publish not confirmed by the broker")

// Dial opens a connection that detects a dead peer within three heartbeats
// and names itself in the management UI. url is an AMQP_URL value: one URL,
// or a cluster's nodes separated by commas, tried in turn (see Nodes; a
// long-lived component keeps one Nodes of its own instead, so that each
// reconnect starts where the last connection went).
func Dial(url string, heartbeat time.Duration, name string) (*amqp.Connection, error) {
	nodes, err := ParseNodes(url)
	if err != nil {
		return nil, fmt.Errorf("dial broker: %w", err)
	}
	conn, _, err := nodes.Dial(heartbeat, name)
	return conn, err
}

// ConfirmChannel opens a channel in confirm mode.
func ConfirmChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	return ch, nil
}

// PublishConfirmed publishes msg on a confirm-mode channel and waits until the
// broker has taken responsibility for it. Safe for concurrent use on one channel.
func PublishConfirmed(ctx context.Context, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		return fmt.Errorf("publish to %q with key %q: %w", exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("wait for confirm of publish to %q: %w", exchange, err)
	}
	if !acked {
		return fmt.Errorf("publish to %q with key %q: %w", exchange, key, ErrNotConfirmed)
	}
	return nil
}
