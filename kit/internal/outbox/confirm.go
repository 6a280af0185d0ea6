package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// epoch is one confirm channel of a session and the confirmer that waits
// for the confirms of its flights, in the order they were published.
type epoch struct {
	s       *session
	ch      *confirmChannel
	flights chan *flight
	// fault is closed when the channel can confirm no more: it closed, or a
	// confirm did not come within the publish timeout (err says so).
	fault     chan struct{}
	faultOnce sync.Once
	err       error
	done      chan struct{}
	// left are the rows without a confirm once the channel failed, in the
	// order they were published; the confirmer's until done is closed.
	left []inFlight
}

func (s *session) newEpoch() (*epoch, error) {
	ch, err := s.l.openChannel(s.rows)
	if err != nil {
		return nil, err
	}
	e := &epoch{s: s, ch: ch, flights: make(chan *flight, claimsInFlight+1), fault: make(chan struct{}), done: make(chan struct{})}
	go e.confirm()
	return e, nil
}

// finish lets the confirmer go through the flights handed to it (each
// confirmed or failed within its publish timeout), and returns the rows it
// left without a confirm.
func (e *epoch) finish() []inFlight {
	close(e.flights)
	<-e.done
	return e.left
}

func (e *epoch) failed(err error) {
	e.faultOnce.Do(func() {
		e.err = err
		close(e.fault)
	})
}

func (e *epoch) broken() bool {
	select {
	case <-e.fault:
		return true
	default:
		return false
	}
}

// confirm waits for each flight's confirms and hands what they say to the
// completer: confirmed and taken by a queue, sent; returned (no queue
// bound), or refused (nack), failed with an attempt. Once the channel has
// failed, every row without a confirm is left for the session to sort out.
func (e *epoch) confirm() {
	defer close(e.done)
	r := e.s.r
	returned := map[string]amqp.Return{} // returns not yet matched with a confirm
	for f := range e.flights {
		timeout := r.cfg.PublishTimeout
		ctx, cancel := context.WithDeadline(context.Background(), f.began.Add(timeout))
		var st settlement
		for _, row := range f.rows {
			if row.dc == nil || e.broken() {
				e.left = append(e.left, row)
				continue
			}
			acked, err := row.dc.WaitContext(ctx)
			// The broker sends a mandatory publish's return before its confirm.
			drainReturns(e.ch.returns, returned)
			switch {
			case err != nil:
				e.failed(fmt.Errorf("no confirm of outbox row %s within %s: %w", row.c.ID, timeout, err))
				e.left = append(e.left, row)
			case !acked && e.ch.ch.IsClosed():
				// The library fails the confirms still awaited when the
				// channel closes: not a refusal.
				e.failed(nil)
				e.left = append(e.left, row)
			case !acked:
				st.failed = append(st.failed, failed{c: row.c, span: row.span, reason: ReasonRefused, cause: "the broker refused it (basic.nack)"})
			default:
				if ret, ok := returned[row.c.ID]; ok {
					delete(returned, row.c.ID)
					st.failed = append(st.failed, unroutable(row, ret))
					continue
				}
				st.sent = append(st.sent, row.c)
				row.span.End()
			}
		}
		cancel()
		r.metrics.publishSeconds.WithLabelValues(r.store.Producer()).Observe(time.Since(f.began).Seconds())
		e.s.c.settle(st)
	}
}

func drainReturns(returns <-chan amqp.Return, into map[string]amqp.Return) {
	for {
		select {
		case ret, ok := <-returns:
			if !ok { // the library closed it with the channel
				return
			}
			into[ret.MessageId] = ret
		default:
			return
		}
	}
}

func unroutable(row inFlight, ret amqp.Return) failed {
	return failed{c: row.c, span: row.span, reason: ReasonUnroutable,
		cause: fmt.Sprintf("returned by the broker: %d %s (no queue is bound to %s with key %s)",
			ret.ReplyCode, ret.ReplyText, row.c.Exchange, row.c.RoutingKey),
		err: fmt.Errorf("%w (%d %s)", rabbit.ErrReturned, ret.ReplyCode, ret.ReplyText)}
}

// isolate publishes the rows a channel close left without a confirm, one at
// a time, each on an open channel and waiting for its confirm: the row the
// broker closes the channel on is the one it refused, and spends an
// attempt; the others are sent (or returned) as usual, a row published
// before the close perhaps twice, with the same id. Each row is settled as
// soon as its confirm says what became of it, and a row whose lease would
// end before its confirm could come is given back unpublished: past its
// lease another relay may publish it, and two relays must never publish one
// row at once (a key's head published again after its successor). When the
// connection fails meanwhile, the rows not yet sorted out go back without an
// attempt.
func (s *session) isolate(rows []inFlight, first *amqp.Error) error {
	var ch *confirmChannel
	defer func() {
		if ch != nil {
			_ = ch.ch.Close()
		}
	}()
	timeout := s.r.cfg.PublishTimeout
	for i, row := range rows {
		if !s.r.leaseOutlasts(row.c, timeout) {
			s.c.settle(settlement{unconfirmed: claimedOf([]inFlight{row})})
			continue
		}
		if ch == nil {
			var err error
			if ch, err = s.l.openChannel(1); err != nil {
				s.c.settle(settlement{unconfirmed: claimedOf(rows[i:])})
				return err
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		acked, err := publishOne(ctx, ch, row.c)
		cancel()
		returned := map[string]amqp.Return{}
		drainReturns(ch.returns, returned)
		var st settlement
		switch closeErr := ch.closeError(); {
		case err == nil && acked:
			if ret, ok := returned[row.c.ID]; ok {
				st.failed = append(st.failed, unroutable(row, ret))
				break
			}
			st.sent = append(st.sent, row.c)
			row.span.End()
		case err == nil && !ch.ch.IsClosed():
			st.failed = append(st.failed, failed{c: row.c, span: row.span, reason: ReasonRefused, cause: "the broker refused it (basic.nack)"})
		case s.l.onARow(closeErr):
			st.failed = append(st.failed, failed{c: row.c, span: row.span, reason: ReasonRefused,
				cause: fmt.Sprintf("the broker closed the channel on it: %d %s", closeErr.Code, closeErr.Reason)})
			ch = nil
		default:
			s.c.settle(settlement{unconfirmed: claimedOf(rows[i:])})
			if err == nil {
				err = errors.New("the channel closed before the confirm came")
			}
			if closeErr == nil {
				closeErr = first
			}
			return fmt.Errorf("sending outbox row %s alone: %w (the channel closed first on %v)", row.c.ID, err, closeErr)
		}
		s.c.settle(st)
	}
	return nil
}

// publishOne publishes a row and waits for its confirm.
func publishOne(ctx context.Context, ch *confirmChannel, c Claimed) (bool, error) {
	dc, err := ch.ch.PublishWithDeferredConfirm(c.Exchange, c.RoutingKey, c.Mandatory, false, publishing(c))
	if err != nil {
		return false, err
	}
	return dc.WaitContext(ctx)
}
