package producer

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/kit/rabbit"
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
		_ = conn.Close()
		return nil, err
	}
	// Idempotent: the payment service declares the same exchange at its start.
	if err := ch.ExchangeDeclare(b.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("declare exchange %s: %w", b.Exchange, err)
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
