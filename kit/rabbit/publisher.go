package rabbit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/tracing"
	"github.com/inbox-template/payment-service/kit/wire"
)

// ErrReturned means the broker took a mandatory message but no queue did: the
// broker confirms such a message too, so a confirm alone proves nothing.
var ErrReturned = errors.New("returned by the broker: no queue is bound for it")

// Publisher publishes mandatory messages with confirms, one at a time, and
// reports a message no queue took as ErrReturned. The broker sends the return
// of a publish before its confirm, on the same channel, so one publish in
// flight and a return slot of one are enough. Safe for concurrent use; meant
// for rare moves (retries, dead letters, replays), not for bulk publishing.
type Publisher struct {
	mu      sync.Mutex
	ch      *amqp.Channel
	returns chan amqp.Return
	tracer  *tracing.Tracer
}

// NewPublisher opens a confirm-mode channel on conn.
func NewPublisher(conn *amqp.Connection) (*Publisher, error) {
	ch, err := ConfirmChannel(conn)
	if err != nil {
		return nil, err
	}
	return &Publisher{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1))}, nil
}

// Traced makes each publish a producer span of t (nil: none) that the message's
// headers carry on.
func (p *Publisher) Traced(t *tracing.Tracer) *Publisher {
	p.tracer = t
	return p
}

// NotifyClose registers c for the close of the publisher's channel.
func (p *Publisher) NotifyClose(c chan *amqp.Error) chan *amqp.Error { return p.ch.NotifyClose(c) }

// Close closes the channel.
func (p *Publisher) Close() error { return p.ch.Close() }

// Publish publishes msg and returns nil only once a queue has it.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	ctx, span := p.tracer.Publish(ctx, exchange, key, &msg)
	err := p.publish(ctx, exchange, key, msg)
	span.Fail(err)
	span.End()
	return err
}

func (p *Publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainReturns() // left by an earlier publish whose wait was cut short
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return fmt.Errorf("publish to %q with key %q: %w", exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("wait for confirm of publish to %q: %w", exchange, err)
	case !acked:
		return fmt.Errorf("publish to %q with key %q: %w", exchange, key, ErrNotConfirmed)
	}
	select {
	case r, ok := <-p.returns:
		if ok {
			return fmt.Errorf("publish to %q with key %q: %w (%d %s)", exchange, key, ErrReturned, r.ReplyCode, r.ReplyText)
		}
	default:
	}
	return nil
}

func (p *Publisher) drainReturns() {
	for {
		select {
		case _, ok := <-p.returns:
			if !ok { // the channel is closed: the publish below will say so
				return
			}
		default:
			return
		}
	}
}

// Copy is d as its producer published it, ready to publish again: every
// property and header (in a new table) but two, and persistent. The
// expiration is dropped, since a stale per-message TTL would expire the copy,
// and so is the user id, since RabbitMQ refuses one other than the publishing
// connection's user.
func Copy(d amqp.Delivery) amqp.Publishing {
	headers := make(amqp.Table, len(d.Headers))
	maps.Copy(headers, d.Headers)
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// Origin is the exchange and routing key d was published with. A delivery
// through an exchange (d.Exchange set: a producer's publish, or a message
// dead-lettered into that exchange by a queue upstream) shows them itself,
// whatever its headers say. One through the default exchange (from a retry
// queue, or replayed) is a copy: HeaderOrigin reads them from its headers.
// ok is false when d says nothing of them; key is then d's own.
func Origin(d amqp.Delivery) (exchange, key string, ok bool) {
	if d.Exchange != "" {
		return d.Exchange, d.RoutingKey, true
	}
	if exchange, key, ok = HeaderOrigin(d.Headers); ok {
		return exchange, key, true
	}
	return "", d.RoutingKey, false
}

// HeaderOrigin is the exchange and routing key a consumer's copy of a
// message carries (wire.HeaderOriginalExchange, wire.HeaderOriginalKey); ok
// is false when it carries none.
func HeaderOrigin(h amqp.Table) (exchange, key string, ok bool) {
	key, found := h[wire.HeaderOriginalKey].(string)
	exchange, _ = h[wire.HeaderOriginalExchange].(string)
	return exchange, key, found && exchange != ""
}

// DeathOrigin is the exchange and routing key a message the broker
// dead-lettered itself (past the delivery limit, or rejected) was published
// with, for a replay: those of its latest death in a queue it reached
// through a named exchange (x-death lists the most recent first), the work
// queue's, not an upstream delay queue's before it, nor a retry queue's,
// which the consumer fed through the default exchange. ok is false when
// x-death names none.
func DeathOrigin(h amqp.Table) (exchange, key string, ok bool) {
	deaths, _ := h["x-death"].([]any)
	for _, d := range deaths {
		death, _ := d.(amqp.Table)
		exchange, _ = death["exchange"].(string)
		keys, _ := death["routing-keys"].([]any)
		if exchange == "" || len(keys) == 0 {
			continue
		}
		if k, found := keys[0].(string); found {
			return exchange, k, true
		}
	}
	return "", "", false
}
