package producer

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Broker says where the load goes.
type Broker struct {
	URL        string
	Exchange   string // topic exchange, declared durable if missing
	RoutingKey string
	Heartbeat  time.Duration // zero means 10s
	Name       string        // connection name shown in the management UI
}

const closeTimeout = 5 * time.Second

// session is one connection with one confirm channel. Its goroutines drain the
// Notify* channels, which the client closes when the connection goes away;
// close waits for them.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	node string // the broker node's host:port
	wg   sync.WaitGroup
}

// openSession connects to a node of nodes, declares the exchange and starts
// draining returns and close notifications. onReturn runs on another
// goroutine.
func openSession(nodes *rabbit.Nodes, b Broker, log *slog.Logger, onReturn func(amqp.Return)) (*session, error) {
	heartbeat := b.Heartbeat
	if heartbeat == 0 {
		heartbeat = 10 * time.Second
	}
	conn, node, err := nodes.Dial(heartbeat, b.Name)
	if err != nil {
		return nil, err
	}
	ch, err := rabbit.ConfirmChannel(conn)
	if err != nil {
		return nil, setupFailed(conn, err)
	}
	// Idempotent: the payment service declares the same exchange at its start.
	if err := ch.ExchangeDeclare(b.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return nil, setupFailed(conn, fmt.Errorf("declare exchange %s: %w", b.Exchange, err))
	}
	s := &session{conn: conn, ch: ch, node: node}
	// The client delivers returns synchronously from its reader goroutine:
	// buffer them and always drain, or a burst of returns stalls every confirm.
	returns := ch.NotifyReturn(make(chan amqp.Return, 256))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		for r := range returns {
			onReturn(r)
		}
	}()
	go drainClose(&s.wg, chClosed, log, "channel closed")
	go drainClose(&s.wg, connClosed, log, "connection lost")
	return s, nil
}

// errConnectionLost marks a setup that failed because the connection went
// away under it (the broker closed it, or the client found it closed), not
// because of what it asked: an outage, where a refused declaration (403,
// 406) is a mistake.
var errConnectionLost = errors.New("the connection was lost during the setup")

// setupFailed closes conn after a failed setup step and says whether the
// connection was lost: the broker's close arrives as amqp.ErrClosed between
// two calls, and as its own error (320 CONNECTION_FORCED, say) during one.
func setupFailed(conn *amqp.Connection, err error) error {
	lost := conn.IsClosed() || errors.Is(err, amqp.ErrClosed)
	var ae *amqp.Error
	if errors.As(err, &ae) && !ae.Recover && (ae.Code == amqp.ConnectionForced || ae.Code == amqp.FrameError || ae.Code == amqp.InternalError) {
		lost = true
	}
	_ = conn.Close()
	if lost {
		return fmt.Errorf("%w: %w", errConnectionLost, err)
	}
	return err
}

func drainClose(wg *sync.WaitGroup, c <-chan *amqp.Error, log *slog.Logger, msg string) {
	defer wg.Done()
	for err := range c {
		log.Warn(msg, "err", err)
	}
}

// close closes the connection, which settles every outstanding confirm as not
// acked, and waits for the drain goroutines.
func (s *session) close() {
	// The deadline bounds the handshake with a broker that stopped answering.
	// The error only says the connection was already gone, which is fine.
	_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
	s.wg.Wait()
}
