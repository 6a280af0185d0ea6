package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/rabbit"
)

// session is one broker connection's lifetime: a consuming channel, a confirm
// channel for retries and dead letters, and the workers. Deliveries never
// outlive their session: each is settled through its own channel (the
// delivery's Acknowledger), so after a reconnect an old delivery tag can only
// fail on its closed channel, never settle another message on a new one.
type session struct {
	conn    *amqp.Connection
	consume *amqp.Channel
	publish *rabbit.Publisher
	// pause is closed once by the first worker that finds the database down.
	pause     chan struct{}
	pauseOnce sync.Once
}

func (s *session) requestPause() { s.pauseOnce.Do(func() { close(s.pause) }) }

func (r *Runtime) openSession() (*session, error) {
	conn, err := rabbit.Dial(r.cfg.AMQPURL, r.cfg.Heartbeat, r.cfg.Name)
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn, pause: make(chan struct{})}
	if err := r.openChannels(s); err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

func (r *Runtime) openChannels(s *session) error {
	var err error
	if s.consume, err = s.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := r.cfg.Topology.Declare(s.consume); err != nil {
		return err
	}
	if err := s.consume.Qos(r.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	s.publish, err = rabbit.NewPublisher(s.conn)
	return err
}

// session runs one broker session until the context is cancelled (graceful
// shutdown, returns nil), the connection or a channel dies, or the database
// goes down (returns errDatabaseDown).
func (r *Runtime) session(ctx context.Context) error {
	if err := r.pingDatabase(ctx); err != nil {
		return fmt.Errorf("%w: %w", errDatabaseDown, err)
	}
	s, err := r.openSession()
	if err != nil {
		return err
	}
	defer s.conn.Close()
	// Every Notify channel is buffered and read or left to be closed by the
	// library: an unbuffered, unread one would block its connection.
	connClosed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	consumeClosed := s.consume.NotifyClose(make(chan *amqp.Error, 1))
	publishClosed := s.publish.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := s.consume.NotifyCancel(make(chan string, 1))

	tag := fmt.Sprintf("%s-%d", r.cfg.Name, time.Now().UnixNano())
	deliveries, err := s.consume.Consume(r.cfg.Topology.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.cfg.Topology.Queue, err)
	}
	r.setReady(true)
	r.log.Info("consuming", "queue", r.cfg.Topology.Queue, "prefetch", r.cfg.Prefetch, "workers", r.cfg.Workers)

	// work outlives ctx by the shutdown timeout so in-flight messages can commit.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() { r.work(work, s, deliveries, stop) })
	}

	var reason error
	select {
	case <-ctx.Done():
	case e := <-connClosed:
		reason = fmt.Errorf("connection closed: %v", e)
	case e := <-consumeClosed:
		reason = fmt.Errorf("consume channel closed: %v", e)
	case e := <-publishClosed:
		reason = fmt.Errorf("publish channel closed: %v", e)
	case <-cancelled:
		reason = errors.New("consumer cancelled by the broker (queue deleted?)")
	case <-s.pause:
		reason = errDatabaseDown
	}
	r.setReady(false)
	close(stop)
	if reason == nil || errors.Is(reason, errDatabaseDown) {
		// Tell the broker to stop sending; prefetched deliveries not yet taken by
		// a worker go back to the queue when the channel closes.
		_ = s.consume.Cancel(tag, false)
	}
	r.drain(&wg, cancelWork)
	_ = s.consume.Close()
	_ = s.publish.Close()
	return reason
}

// drain waits for the workers, cancelling their context once ShutdownTimeout
// has passed so that a stuck handler rolls back instead of blocking the stop.
func (r *Runtime) drain(wg *sync.WaitGroup, cancelWork context.CancelFunc) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(r.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	r.log.Warn("in-flight messages exceeded the shutdown timeout; abandoning them unacked", "timeout", r.cfg.ShutdownTimeout.String())
	cancelWork()
	<-done
}

// work takes deliveries until stop is closed or the channel is gone.
func (r *Runtime) work(ctx context.Context, s *session, deliveries <-chan amqp.Delivery, stop <-chan struct{}) {
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
			r.deliverSafely(ctx, s, d)
			done()
		}
	}
}

// deliverSafely contains a panic outside the handler (the handler's own are
// recovered by the Recover middleware): in a KeyFromBody or LogAttrs of a
// cloner, say. The delivery is rejected without requeue, so RabbitMQ
// dead-letters it (x-death reason "rejected") instead of every replica
// crashing on it in turn.
func (r *Runtime) deliverSafely(ctx context.Context, s *session, d amqp.Delivery) {
	defer func() {
		if v := recover(); v != nil {
			r.metrics.panics.WithLabelValues(r.cfg.Name).Inc()
			r.log.Error("panic outside the handler; rejecting the delivery to the dead-letter exchange",
				"message_id", d.MessageId, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			_ = d.Reject(false)
		}
	}()
	r.deliver(ctx, s, d)
}
