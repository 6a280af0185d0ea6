package faultkit

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Publish sends msgs to exchange with key at perSecond messages a second,
// each persistent and confirmed by the broker before the next, as a
// producer that survives the faults does: when the connection drops (the
// broker closed it, say) it connects again and sends the unconfirmed
// message once more (the same message id: a duplicate the inbox
// suppresses). It gives up after timeout.
func Publish(amqpURL, exchange, key string, msgs []amqp.Publishing, perSecond int, timeout time.Duration) error {
	nodes, err := rabbit.ParseNodes(amqpURL) // a cluster's every node: a lost one is passed over
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(time.Second / time.Duration(max(perSecond, 1)))
	defer tick.Stop()
	var ch *amqp.Channel
	var conn *amqp.Connection
	var node string
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for i := 0; i < len(msgs); {
		if ch == nil {
			c, at, err := nodes.Dial(10*time.Second, "faultkit load")
			node = at
			if err == nil {
				ch, err = c.Channel()
				if err == nil {
					err = ch.Confirm(false)
				}
				if err != nil {
					c.Close()
					ch = nil
				} else {
					conn = c
				}
			}
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("connect: %w (after %d of %d messages)", err, i, len(msgs))
				}
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("published %d of %d messages within %s", i, len(msgs), timeout)
		case <-tick.C:
		}
		m := msgs[i]
		if m.ContentType == "" {
			m.ContentType = "application/json"
		}
		m.DeliveryMode = amqp.Persistent
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, m)
		ok := false
		if err == nil {
			ok, err = dc.WaitContext(ctx)
		}
		if err != nil || !ok {
			// The connection dropped, or the broker refused: connect again
			// and send this message once more, first to another node if
			// this one's connection died.
			if err != nil {
				nodes.Lost(node)
			}
			conn.Close()
			ch, conn = nil, nil
			continue
		}
		i++
	}
	return nil
}
