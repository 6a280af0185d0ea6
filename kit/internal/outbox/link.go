package outbox

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// link is one broker connection of the relay. A channel the broker closes
// on one row (404, 403, 406) is replaced on the same connection; only the
// connection's loss ends the session.
type link struct {
	conn       *amqp.Connection
	node       string // host:port
	connClosed chan *amqp.Error
	// blocked follows the broker blocking the connection (a resource alarm).
	blocked *amqpsession.Blocked
}

func (r *Relay) dial() (*link, error) {
	conn, node, err := r.nodes.Dial(r.cfg.Heartbeat, r.cfg.Name+" outbox")
	if err != nil {
		return nil, err
	}
	l := &link{conn: conn, node: node, connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		blocked: amqpsession.WatchBlocked(conn, nil)}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	for _, ex := range r.cfg.Exchanges {
		if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("declare exchange %s: %w", ex, err)
		}
	}
	return l, nil
}

func (l *link) blockedUntil() <-chan struct{} { return l.blocked.Until() }

func (l *link) close() {
	_ = l.conn.CloseDeadline(time.Now().Add(2 * time.Second))
}

// confirmChannel is a channel in confirm mode with its returns and its close.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// openChannel opens a confirm channel whose returns have room for rows
// publishes in flight, so that the library's reader never waits on them.
func (l *link) openChannel(rows int) (*confirmChannel, error) {
	ch, err := rabbit.ConfirmChannel(l.conn)
	if err != nil {
		return nil, err
	}
	return &confirmChannel{ch: ch,
		returns: ch.NotifyReturn(make(chan amqp.Return, rows)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// closeError is why the channel closed, once it has: the library sends it
// before it fails the confirms still awaited.
func (c *confirmChannel) closeError() *amqp.Error {
	select {
	case e := <-c.closed:
		return e
	default:
		return nil
	}
}

// onARow says whether e, the close of a channel of l, is the broker's
// answer to one publish (a channel error: no exchange, 404; no permission,
// 403; over the size limit, 406) on a connection still open, rather than
// the link's loss.
func (l *link) onARow(e *amqp.Error) bool {
	return e != nil && e.Server && e.Recover && !l.conn.IsClosed()
}
