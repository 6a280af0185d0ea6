package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/amqpsession"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// session is one broker connection pair's lifetime: a consuming channel, a
// confirm channel for retries and dead letters, and the workers. Deliveries
// never outlive their session: each is settled through its own channel (the
// delivery's Acknowledger), so after a reconnect an old delivery tag can only
// fail on its closed channel, never settle another message on a new one.
//
// Consuming and publishing use connections of their own, as RabbitMQ advises:
// under a memory or disk alarm the broker blocks every connection that
// publishes, and would stop reading the acks of a shared one, so the consumer
// could not drain what would clear the alarm.
type session struct {
	conn    *amqp.Connection // consuming: acks, nacks, deliveries
	pubConn *amqp.Connection // publishing: retry, dead-letter and returned copies
	// node and pubNode are the broker nodes of the two (host:port).
	node, pubNode string
	consume       *amqp.Channel
	acks          *acker // every settle of the consuming channel's deliveries goes through it
	publish       *rabbit.Publisher
	// pause is closed once by the first worker that finds the infrastructure
	// at fault; cause names it.
	pause     chan struct{}
	pauseOnce sync.Once
	cause     Cause
	// end is closed once by the first step that ends the session without a
	// pause; ended says why. A copy that came back unrouted (a queue of the
	// topology was deleted: the next session declares it again), or a
	// buffered ingest that must give its deliveries back in the queue's order.
	end     chan struct{}
	endOnce sync.Once
	ended   error
	// blocked follows the broker blocking the publishing connection (a
	// resource alarm); set once the session runs.
	blocked *amqpsession.Blocked
	// aside are the buffered ingest's dead-letterings, done off its loop.
	aside sync.WaitGroup
	// stop is closed when the session stops taking deliveries.
	stop chan struct{}
}

// lost tells nodes which of the session's connections died before the
// session closed them (a node gone, a network cut), so that the next
// session dials another node first. It runs before the session's close.
func (s *session) lost(nodes *rabbit.Nodes) {
	if s.conn.IsClosed() {
		nodes.Lost(s.node)
	}
	if s.pubConn.IsClosed() {
		nodes.Lost(s.pubNode)
	}
}

// waitUnblocked returns at once unless the publishing connection is blocked;
// then it waits for the alarm to clear. A publish would only wait for its
// confirm instead, time out, and requeue its original, which a quorum queue
// counts against the delivery limit.
func (s *session) waitUnblocked(ctx context.Context) error {
	if s.blocked == nil {
		return nil
	}
	return s.blocked.WaitUnblocked(ctx)
}

// errRedeclare ends a session whose topology lost a queue.
var errRedeclare = errors.New("a copy was returned unrouted (a queue of the topology is missing): reconnecting to declare it again")

func (s *session) requestRedeclare() { s.requestEnd(errRedeclare) }

// requestEnd ends the session with reason (the first reason wins): the
// runtime reconnects after the usual backoff.
func (s *session) requestEnd(reason error) {
	s.endOnce.Do(func() { s.ended = reason; close(s.end) })
}

func (s *session) requestPause(cause Cause) {
	s.pauseOnce.Do(func() { s.cause = cause; close(s.pause) })
}

// ending reports whether the session is about to end, paused or not.
func (s *session) ending() bool { return closed(s.pause) || closed(s.end) }

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (r *Runtime) openSession() (*session, error) {
	conn, node, err := r.nodes.Dial(r.cfg.Heartbeat, r.cfg.Name+" consume")
	if err != nil {
		return nil, err
	}
	pubConn, pubNode, err := r.nodes.Dial(r.cfg.Heartbeat, r.cfg.Name+" publish")
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	s := &session{conn: conn, pubConn: pubConn, node: node, pubNode: pubNode,
		pause: make(chan struct{}), end: make(chan struct{}), stop: make(chan struct{})}
	r.frameMax.Store(int64(pubConn.Config.FrameSize))
	if err := r.openChannels(s); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// connected logs and counts a session on another node than the last one:
// a failover.
func (r *Runtime) connected(s *session) {
	if from := r.node.Connected(s.node); from != "" {
		r.metrics.failovers.WithLabelValues(r.cfg.Name).Inc()
		r.log.Warn("broker failover: this session is on another node", "from", from, "to", s.node, "nodes", r.nodes.String())
	}
}

// close closes both connections, and with them their channels (the
// consuming channel's unacked deliveries go back to the queue), each within
// closeTimeout: under a memory or disk alarm the broker stops reading a
// publishing connection, and a close waiting for its close-ok would wait for
// the alarm to clear; past the deadline the socket is closed, which the
// broker takes the same way.
func (s *session) close() {
	if s.acks != nil {
		s.acks.close() // the held acks go before the channel closes
	}
	deadline := time.Now().Add(closeTimeout)
	_ = s.conn.CloseDeadline(deadline)
	_ = s.pubConn.CloseDeadline(deadline)
}

// closeTimeout bounds the close of one session's connections.
const closeTimeout = 2 * time.Second

func (r *Runtime) openChannels(s *session) error {
	var err error
	if s.consume, err = s.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	s.acks = newAcker(s.consume.Ack, ackHold, func(err error, held int) {
		r.log.Warn("held acks failed after their commits; their redeliveries will be duplicates", "count", held, "err", err)
	})
	if err := r.cfg.Topology.Declare(s.consume); err != nil {
		return err
	}
	if err := s.consume.Qos(r.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	if s.publish, err = rabbit.NewPublisher(s.pubConn); err != nil {
		return err
	}
	s.publish.Traced(r.cfg.Tracer)
	return nil
}

// session runs one broker session until the context is cancelled (graceful
// shutdown, returns nil), the connection or a channel dies, or a worker finds
// the infrastructure at fault (returns errPausedSession).
func (r *Runtime) session(ctx context.Context) error {
	if err := r.judge.pingDatabase(ctx); err != nil {
		return errPausedSession{cause: causeDatabase}
	}
	s, err := r.openSession()
	if err != nil {
		return err
	}
	var watching <-chan struct{}
	defer func() {
		if watching != nil {
			<-watching // the watcher ends when the connection closes
		}
	}()
	defer s.close()
	defer s.lost(r.nodes) // before the close: a connection closed by then died under us
	r.connected(s)
	// Every Notify channel is buffered and read or left to be closed by the
	// library: an unbuffered, unread one would block its connection.
	connClosed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	pubConnClosed := s.pubConn.NotifyClose(make(chan *amqp.Error, 1))
	s.blocked = amqpsession.WatchBlocked(s.pubConn, r.blockedChanged)
	watching = s.blocked.Done()
	consumeClosed := s.consume.NotifyClose(make(chan *amqp.Error, 1))
	publishClosed := s.publish.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := s.consume.NotifyCancel(make(chan string, 1))

	tag := fmt.Sprintf("%s-%d", r.cfg.Name, time.Now().UnixNano())
	deliveries, err := s.consume.Consume(r.cfg.Topology.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.cfg.Topology.Queue, err)
	}
	r.setReady(true)
	r.log.Info("consuming", "queue", r.cfg.Topology.Queue, "node", s.node, "prefetch", r.cfg.Prefetch, "workers", r.cfg.Workers)

	// work outlives ctx by the shutdown timeout so in-flight messages can commit.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := s.stop
	var wg sync.WaitGroup
	r.mode.consume(work, s, deliveries, stop, &wg)

	var reason error
	select {
	case <-ctx.Done():
	case e := <-connClosed:
		reason = fmt.Errorf("connection closed: %v", e)
	case e := <-pubConnClosed:
		reason = fmt.Errorf("publishing connection closed: %v", e)
	case e := <-consumeClosed:
		reason = fmt.Errorf("consume channel closed: %v", e)
	case e := <-publishClosed:
		reason = fmt.Errorf("publish channel closed: %v", e)
	case <-cancelled:
		reason = errors.New("consumer cancelled by the broker (queue deleted?)")
	case <-s.pause:
		reason = errPausedSession{cause: s.cause}
	case <-s.end:
		reason = s.ended
	}
	r.setReady(false)
	close(stop)
	// A graceful stop (or a pause) cancels the consumer, so that the
	// deliveries the broker sent before the cancel-ok can be dealt with
	// here: a return by the channel's close would count against the quorum
	// queue's delivery limit. Inline, they are republished to the work queue
	// (returnUnstarted); the buffered ingest stores them (ingestRest), in the
	// order they came, so at a graceful stop nothing goes back at all.
	//
	// Except for the buffered ingest under a single active consumer, which
	// never cancels: the broker would hand the queue to the next consumer at
	// the cancel, while this one still stored what it had been sent, and the
	// two would store one key's messages out of order. It finishes the batch
	// in hand and closes the channel, which gives back every unstored
	// delivery in one step, in the queue's order, before the next consumer
	// gets any; each of those returns counts once against
	// QUEUE_DELIVERY_LIMIT. A buffered ingest that is pausing or ending never
	// cancels either: what it could not store must go back in order, not to
	// the tail of the queue.
	stopped := false
	if r.mode.cancels(reason) {
		// Tell the broker to stop sending; the deliveries it sent before the
		// cancel-ok arrive, then the channel of deliveries closes.
		stopped = s.consume.Cancel(tag, false) == nil
	}
	r.drain(&wg, cancelWork)
	if stopped {
		// Within what is left of the stop's budget: under a broker alarm the
		// copies cannot be published, and the channel's close returns the
		// rest instead.
		returning, cancelReturning := r.phaseContext()
		r.mode.rest(returning, func() { cancelReturning(); cancelWork() }, s, deliveries)
		cancelReturning()
	}
	r.drain(&s.aside, cancelWork)
	return reason // the deferred close closes the channels with their connections
}

// drain waits for the workers, cancelling their context once the phase's
// time is up (see phaseContext) so that a stuck handler rolls back instead
// of blocking the stop.
func (r *Runtime) drain(wg *sync.WaitGroup, cancelWork context.CancelFunc) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	phase, cancel := r.phaseContext()
	defer cancel()
	select {
	case <-done:
		return
	case <-phase.Done():
	}
	r.log.Warn("in-flight messages exceeded the shutdown timeout; abandoning them unacked", "timeout", r.cfg.ShutdownTimeout.String())
	cancelWork()
	<-done
}

// A graceful stop has one budget, ShutdownTimeout from the moment the
// runtime's context ends, shared by all its phases: the drain of the workers,
// the return or storing of the unstarted deliveries, the dead-letterings and
// status updates in flight, in both modes. A session ending while the
// runtime goes on (a pause, a lost connection) gives each phase
// ShutdownTimeout, cut to the stop's budget if a stop begins meanwhile.

// markStopping starts the stop's budget; Run calls it when its context ends.
func (r *Runtime) markStopping() {
	r.stopOnce.Do(func() {
		r.stopBy = time.Now().Add(r.cfg.ShutdownTimeout)
		close(r.stopping)
	})
}

// stopLeft reports what is left of the stop's budget, and false while the
// runtime is not stopping.
func (r *Runtime) stopLeft() (time.Duration, bool) {
	select {
	case <-r.stopping:
		return max(time.Until(r.stopBy), 0), true
	default:
		return 0, false
	}
}

// phaseContext bounds one phase of a session's end: ShutdownTimeout, or what
// is left of the stop's budget, whichever ends first, also when the stop
// begins during the phase.
func (r *Runtime) phaseContext() (context.Context, context.CancelFunc) {
	if left, ok := r.stopLeft(); ok {
		return context.WithTimeout(context.Background(), left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	go func() {
		select {
		case <-r.stopping:
		case <-ctx.Done():
			return
		}
		left, _ := r.stopLeft()
		t := time.NewTimer(left)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// settleContext bounds a status update of the buffered processing, detached
// from the stop (a message whose run ended is settled even while the service
// stops), within what is left of the stop's budget.
func (r *Runtime) settleContext() (context.Context, context.CancelFunc) {
	d := 5 * time.Second
	if left, ok := r.stopLeft(); ok {
		d = min(d, left)
	}
	return context.WithTimeout(context.Background(), d)
}

// work takes deliveries until stop is closed or the channel is gone.
func (m *inlineMode) work(ctx context.Context, s *session, deliveries <-chan amqp.Delivery, stop <-chan struct{}) {
	r := m.r
	for {
		select { // a closed stop wins over a ready delivery
		case <-stop:
			return
		default:
		}
		select {
		case <-stop:
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			done := r.track()
			m.deliverSafely(ctx, s, d)
			done()
		}
	}
}

// deliverSafely contains a panic outside the handler (the handler's own are
// recovered by the Recover middleware): in a KeyFromBody or LogAttrs of a
// cloner, say. The delivery is rejected without requeue, so RabbitMQ
// dead-letters it (x-death reason "rejected") instead of every replica
// crashing on it in turn.
func (m *inlineMode) deliverSafely(ctx context.Context, s *session, d amqp.Delivery) {
	r := m.r
	defer func() {
		if v := recover(); v != nil {
			r.metrics.panics.WithLabelValues(r.cfg.Name).Inc()
			r.log.Error("panic outside the handler; rejecting the delivery to the dead-letter exchange",
				"message_id", d.MessageId, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if d.Reject(false) == nil {
				s.acks.settled(d.DeliveryTag)
			}
		}
	}()
	m.deliver(ctx, s, d)
}

// blockedChanged reports the broker blocking the publishing connection (a
// memory or disk alarm), or unblocking it. Consumption goes on: acks travel on
// the other connection; copies that cannot be published in time leave their
// original unacked and requeued.
func (r *Runtime) blockedChanged(b amqp.Blocking) {
	v := 0.0
	if b.Active {
		v = 1
		r.log.Warn("the broker blocks publishing (resource alarm): retries and dead letters wait", "reason", b.Reason)
	} else if b.Reason != "" {
		r.log.Info("publishing no longer blocked", "reason", b.Reason) // the connection closed
	} else {
		r.log.Info("the broker unblocked publishing")
	}
	r.metrics.blocked.WithLabelValues(r.cfg.Name).Set(v)
}
