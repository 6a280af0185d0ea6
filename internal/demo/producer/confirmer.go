package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// DefaultWindow is how many publishes may wait for their confirm at once.
const DefaultWindow = 256

// reconnect backoff bounds
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// confirmer publishes with mandatory=true on a confirm channel, keeping at most
// window publishes unconfirmed. When the connection or channel is lost it
// reconnects with backoff and publishes again every message that was not
// confirmed: a message may then arrive twice, but none is lost.
//
// Only the goroutine that calls publish, flush and close may use it.
type confirmer struct {
	broker  Broker
	nodes   *rabbit.Nodes // AMQP_URL's nodes: a reconnect starts after one that was lost
	window  int
	log     *slog.Logger
	sess    *session
	pending []*inFlight // in publishing order; the oldest first
	returns returnTally

	confirmed  int
	nacked     int
	nackPause  time.Duration // set by a nack: the next reconnect waits that long first
	reconnects int
	resent     int // publishes repeated because a lost connection left them unconfirmed
	tracer     *tracing.Tracer
}

// inFlight is a message waiting for its confirm.
type inFlight struct {
	msg   Message
	dc    *amqp.DeferredConfirmation // nil while it must be (re)sent
	sent  bool
	nacks int          // times the broker refused it
	span  tracing.Span // its publish, from the first send to its confirm
}

// maxNacks is how often a message the broker refuses (basic.nack) is sent
// again before it counts as refused. A quorum queue refuses publishes while
// it has no leader (a node lost, an election of a few seconds): with the
// backoff between tries, about 25 s of refusals are waited out.
const maxNacks = 10

// returnTally counts basic.return frames, written by the sessions' drain goroutines.
type returnTally struct {
	mu    sync.Mutex
	n     int
	first amqp.Return
}

func (t *returnTally) add(r amqp.Return) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		t.first = r
	}
	t.n++
}

func (t *returnTally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// newConfirmer connects once, without retrying: a broker that is unreachable
// at the start is a configuration error, not an outage to wait out. A
// connection the broker closes during the setup (a fault that drops the
// vhost's connections, as a CI run caught) is an outage: it reconnects.
func newConfirmer(ctx context.Context, b Broker, window int, log *slog.Logger) (*confirmer, error) {
	if window <= 0 {
		window = DefaultWindow
	}
	nodes, err := rabbit.ParseNodes(b.URL)
	if err != nil {
		return nil, fmt.Errorf("AMQP_URL: %w", err)
	}
	c := &confirmer{broker: b, nodes: nodes, window: window, log: log}
	sess, err := openSession(nodes, b, log, c.onReturn)
	if errors.Is(err, errConnectionLost) {
		log.Warn("the broker closed the connection during the setup, reconnecting", "err", err)
		if err := c.reconnect(ctx); err != nil {
			return nil, err
		}
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	c.sess = sess
	return c, nil
}

func (c *confirmer) onReturn(r amqp.Return) {
	if c.returns.count() == 0 {
		c.log.Warn("message returned unroutable", "message_id", r.MessageId,
			"exchange", r.Exchange, "routing_key", r.RoutingKey, "reply", r.ReplyText)
	}
	c.returns.add(r)
}

// publish sends msg, first waiting for confirms while the window is full.
func (c *confirmer) publish(ctx context.Context, msg Message) error {
	for len(c.pending) >= c.window {
		if err := c.settleOldest(ctx); err != nil {
			return err
		}
	}
	f := &inFlight{msg: msg}
	// One span per message, its resends included: they carry one traceparent.
	_, f.span = c.tracer.Publish(ctx, c.broker.Exchange, c.broker.RoutingKey, &f.msg.Publishing)
	c.pending = append(c.pending, f)
	if c.sess == nil {
		return c.reconnect(ctx) // publishes f with the other unconfirmed messages
	}
	if err := c.send(ctx, f); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("publish %s: %w", describe(msg), ctx.Err())
		}
		c.log.Warn("publish failed, reconnecting", "err", err, "message_id", msg.Publishing.MessageId, "order_id", msg.OrderID)
		return c.reconnect(ctx)
	}
	return nil
}

// send publishes f on the current session.
func (c *confirmer) send(ctx context.Context, f *inFlight) error {
	dc, err := c.sess.ch.PublishWithDeferredConfirmWithContext(ctx, c.broker.Exchange, c.broker.RoutingKey, true, false, f.msg.Publishing)
	if err != nil {
		return err
	}
	if f.sent {
		c.resent++
	}
	f.sent, f.dc = true, dc
	return nil
}

// flush waits until every published message is settled.
func (c *confirmer) flush(ctx context.Context) error {
	for len(c.pending) > 0 {
		if err := c.settleOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// settleOldest waits for the confirm of the oldest unsettled message. A nack
// while the channel is open is the broker refusing the message: after a pause
// it reconnects and sends it again (with every other unconfirmed message),
// and counts it refused after maxNacks. A nack because the channel closed
// means the broker may never have seen it: reconnect and send it again.
func (c *confirmer) settleOldest(ctx context.Context) error {
	f := c.pending[0]
	for f.dc == nil || !c.settled(f) {
		if f.dc != nil {
			select {
			case <-f.dc.Done():
				continue
			case <-ctx.Done():
				return fmt.Errorf("wait for confirm of %s: %w", describe(f.msg), ctx.Err())
			}
		}
		if err := c.reconnect(ctx); err != nil {
			return err
		}
	}
	c.pop()
	return nil
}

// settleArrived counts the confirms that have already arrived, oldest first,
// without waiting: after an interruption the summary still shows them.
func (c *confirmer) settleArrived() {
	for len(c.pending) > 0 {
		f := c.pending[0]
		if f.dc == nil || !c.settled(f) {
			return
		}
		c.pop()
	}
}

func (c *confirmer) pop() {
	c.pending[0].span.End()
	c.pending[0] = nil // let the message be collected
	c.pending = c.pending[1:]
}

// settled reports whether f's confirm decided its fate, counting it if so. It
// clears f.dc when the channel closed under it, so that it is sent again.
func (c *confirmer) settled(f *inFlight) bool {
	select {
	case <-f.dc.Done():
	default:
		return false
	}
	switch {
	case f.dc.Acked():
		c.confirmed++
		return true
	case c.sess == nil || c.sess.ch.IsClosed():
		// The client marks the channel closed before it fails the confirms.
		f.dc = nil
		return false
	case f.nacks < maxNacks:
		f.nacks++
		c.nackPause = backoff(f.nacks)
		c.log.Warn("broker refused a message (nack); sending it again after a pause", "message_id", f.msg.Publishing.MessageId,
			"order_id", f.msg.OrderID, "refusals", f.nacks, "pause", c.nackPause.String())
		f.dc = nil
		return false
	default:
		c.nacked++
		f.span.Fail(errors.New("refused by the broker (basic.nack)"))
		c.log.Error("broker refused a message (nack)", "message_id", f.msg.Publishing.MessageId, "order_id", f.msg.OrderID, "refusals", f.nacks+1)
		return true
	}
}

// close settles nothing more; it ends the session so that the return drain
// goroutine has counted every return before the caller reads the tally.
func (c *confirmer) close() {
	for _, f := range c.pending {
		f.span.Fail(errors.New("no confirm: the run ended first"))
		f.span.End()
	}
	if c.sess != nil {
		c.sess.close()
		c.sess = nil
	}
}

// reconnect replaces the session, retrying with backoff until ctx ends, and
// publishes again every message that has no confirm.
func (c *confirmer) reconnect(ctx context.Context) error {
	if err := c.dropSession(ctx); err != nil {
		return err
	}
	if err := sleep(ctx, c.nackPause); err != nil {
		return fmt.Errorf("pause after a refused message: %w", err)
	}
	c.nackPause = 0
	for attempt := 0; ; attempt++ {
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return fmt.Errorf("reconnect to the broker: %w", err)
		}
		sess, err := openSession(c.nodes, c.broker, c.log, c.onReturn)
		if err != nil {
			c.log.Warn("reconnect failed", "attempt", attempt+1, "err", err)
			continue
		}
		c.sess = sess
		c.reconnects++
		before := c.resent
		err = c.resend(ctx)
		if err == nil {
			c.log.Info("reconnected", "attempt", attempt+1, "node", sess.node, "republished", c.resent-before)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("republish after reconnect: %w", ctx.Err())
		}
		c.log.Warn("republish after reconnect failed", "err", err)
		if err := c.dropSession(ctx); err != nil {
			return err
		}
	}
}

// dropSession closes the session and marks every message without a positive
// confirm for sending again.
func (c *confirmer) dropSession(ctx context.Context) error {
	if c.sess == nil {
		return nil
	}
	// Unless the broker refused a message (a nack, the connection fine), the
	// session failed under us: a node gone, a cut. Not IsClosed alone: after
	// a failed write the client closes the connection on another goroutine,
	// so it may not say closed yet (seen in CI).
	if c.nackPause == 0 || c.sess.conn.IsClosed() {
		c.nodes.Lost(c.sess.node)
	}
	c.sess.close()
	c.sess = nil
	for _, f := range c.pending {
		if f.dc == nil {
			continue
		}
		// Closing the channel fails every outstanding confirm promptly.
		select {
		case <-f.dc.Done():
		case <-ctx.Done():
			return fmt.Errorf("wait for confirms of the closed channel: %w", ctx.Err())
		}
		if !f.dc.Acked() {
			f.dc = nil
		}
	}
	return nil
}

func (c *confirmer) resend(ctx context.Context) error {
	for _, f := range c.pending {
		if f.dc != nil {
			continue
		}
		if err := c.send(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// backoff is zero for the first attempt, then doubles from minBackoff up to maxBackoff.
func backoff(attempt int) time.Duration {
	if attempt == 0 {
		return 0
	}
	d := minBackoff << min(attempt-1, 16)
	return min(d, maxBackoff)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func describe(m Message) string {
	if m.Publishing.MessageId != "" {
		return fmt.Sprintf("message %s (order %s)", m.Publishing.MessageId, m.OrderID)
	}
	return fmt.Sprintf("message without id (order %s)", m.OrderID)
}
