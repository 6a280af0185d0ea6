package outbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// A session relays over one broker connection, as a pipeline of three
// goroutines, so that no round trip waits for another: the session's own
// claims rows and publishes them (a flight per claim), a confirmer waits for
// each flight's confirms in turn, and a completer settles what the confirms
// said, marking the confirmed rows of every flight it has by then in one go.
// The rows claimed and not yet settled are at most claimsInFlight claims'
// worth (the window).
type session struct {
	r    *Relay
	l    *link
	c    *completer
	win  *window
	cur  *epoch // the confirm channel in use
	rows int    // the window's size in rows
}

// flight is one claim's rows, published in this order.
type flight struct {
	rows  []inFlight
	began time.Time
}

// inFlight is a row on its way: its confirm (nil: not published, the
// channel failed first) and its producer span.
type inFlight struct {
	c    Claimed
	dc   *amqp.DeferredConfirmation
	span tracing.Span
}

// session publishes over one broker connection until the connection fails
// or ctx ends; what it claimed is settled before it returns.
func (r *Relay) session(ctx context.Context) error {
	l, err := r.dial()
	if err != nil {
		return err
	}
	defer l.close()
	defer func() {
		if l.conn.IsClosed() { // lost before the deferred close: a node gone, a cut
			r.nodes.Lost(l.node)
		}
	}()
	s := &session{r: r, l: l, rows: claimsInFlight * r.cfg.Batch}
	s.win = newWindow(s.rows)
	if s.cur, err = s.newEpoch(); err != nil {
		return err
	}
	r.blocked.Store(l.blocked)
	defer r.blocked.Store(nil)
	r.setState("")
	r.log.Info("outbox relay connected", "node", l.node, "exchanges", r.cfg.Exchanges)
	if from := r.node.Connected(l.node); from != "" {
		r.metrics.failovers.WithLabelValues(r.store.Producer()).Inc()
		r.log.Warn("broker failover: the outbox relay's session is on another node", "from", from, "to", l.node, "nodes", r.nodes.String())
	}
	s.c = r.startCompleter(s.win)
	err = s.run(ctx)
	// Not ready from here on: what is in flight may take its publish
	// timeout to settle, and the connection its close.
	if err != nil {
		r.setState("outbox relay session ending: " + err.Error())
	} else {
		r.setState("outbox relay stopping")
	}
	// Whatever is in flight is confirmed (or times out) and settled, detached
	// from the stop: a row published and not marked is published again by
	// the next relay, with the same id.
	if s.cur != nil {
		s.c.settle(settlement{unconfirmed: claimedOf(s.cur.finish())})
	}
	s.c.stop()
	return err
}

// run claims and publishes until the connection fails or ctx ends.
func (s *session) run(ctx context.Context) error {
	r := s.r
	more := true // a claim may find rows: at the start, after a full claim
	dbWait := time.Second
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	for {
		blocked := s.l.blockedUntil()
		if blocked != nil || !s.win.fits(r.cfg.Batch) || !more {
			// Blocked by an alarm, full, or nothing known to be due: wait
			// for the unblock, room, a wake-up, a mark that made successors
			// due, or the poll (a wake-up while blocked only says that rows
			// will be due after it).
			select {
			case <-blocked: // nil, never ready, unless blocked
				// Closed by the unblock, or by the connection's close: the
				// close is reported first, but both may be ready here.
				if s.l.conn.IsClosed() {
					return fmt.Errorf("connection closed: %v", <-s.l.connClosed)
				}
			case <-s.win.freed:
			case <-r.outbox.wake: // this process committed rows: tell the others
				signal(r.notify)
				more = true
			case <-r.remote:
				more = true
			case <-r.due:
				more = true
			case <-poll.C:
				poll.Reset(r.cfg.PollInterval)
				more = true
			case e := <-s.l.connClosed:
				return fmt.Errorf("connection closed: %v", e)
			case <-s.cur.fault:
				if err := s.recover(); err != nil {
					return err
				}
			case <-ctx.Done():
				return nil
			}
			continue
		}
		claimed, _, err := r.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Error("claiming outbox rows failed (the database?); trying again", "err", err, "wait", dbWait.String())
			if !sleep(ctx, dbWait) {
				return nil
			}
			dbWait = min(2*dbWait, r.cfg.ReconnectMaxWait)
			continue
		}
		dbWait = time.Second
		// A full claim may have left more due: the rest of a backlog.
		more = len(claimed) == r.cfg.Batch
		if len(claimed) == 0 {
			continue
		}
		s.win.take(len(claimed))
		if err := s.publish(claimed); err != nil {
			if errors.Is(err, errChannelFailed) {
				if err := s.recover(); err != nil {
					return err
				}
				continue
			}
			return err
		}
	}
}

// errChannelFailed: a publish found the channel closed.
var errChannelFailed = errors.New("the outbox relay's channel failed")

// publish sends a claimed batch on the current channel and hands it to the
// confirmer. A row AMQP cannot carry is parked at once, never published: the
// client library would close the whole connection on it.
func (s *session) publish(claimed []Claimed) error {
	r := s.r
	f := &flight{began: time.Now(), rows: make([]inFlight, 0, len(claimed))}
	var invalid []failed
	var err error
	var late []Claimed
	for _, c := range claimed {
		if !r.leaseOutlasts(c, r.cfg.PublishTimeout) {
			late = append(late, c) // the claim took most of the lease: not ours to publish
			continue
		}
		msg := publishing(c)
		row := inFlight{c: c}
		if r.outbox.tracer != nil {
			// A child of the transaction that wrote the row, whose context its headers carry.
			_, row.span = r.outbox.tracer.Publish(r.outbox.tracer.Extract(context.Background(), c.Headers), c.Exchange, c.RoutingKey, &msg)
		}
		if bad := rabbit.CheckPublishing(c.Exchange, c.RoutingKey, msg, s.l.conn.Config.FrameSize); bad != nil {
			invalid = append(invalid, failed{c: c, reason: ReasonInvalid, park: true, span: row.span,
				cause: "AMQP cannot carry it, so it is never published: " + bad.Error()})
			continue
		}
		if err == nil {
			row.dc, err = s.cur.ch.ch.PublishWithDeferredConfirm(c.Exchange, c.RoutingKey, c.Mandatory, false, msg)
			if err != nil && !s.linkFault(err) {
				// The frame could not be written: the row's own fault. The
				// library closes the connection on it.
				invalid = append(invalid, failed{c: c, reason: ReasonInvalid, park: true, span: row.span,
					cause: "the client library could not send it: " + err.Error()})
				err = fmt.Errorf("publish outbox row %s: %w", c.ID, err)
				continue
			}
		}
		f.rows = append(f.rows, row)
	}
	if len(late) > 0 {
		s.c.settle(settlement{unconfirmed: late})
	}
	if len(invalid) > 0 {
		s.c.settle(settlement{failed: invalid})
	}
	if len(f.rows) > 0 {
		s.cur.flights <- f
	}
	switch {
	case err == nil:
		return nil
	case s.linkFault(err) && !s.l.conn.IsClosed():
		return errChannelFailed
	}
	return err
}

// linkFault says whether a publish failed because the channel or the
// connection is gone, rather than because of what it sent.
func (s *session) linkFault(err error) bool {
	var ne net.Error
	return errors.Is(err, amqp.ErrClosed) || errors.As(err, &ne) || s.l.conn.IsClosed() || s.cur.ch.ch.IsClosed()
}

// recover handles the failure of the current channel. A channel the broker
// closed on a row of its (404, 403, 406), on a connection still open, has its
// rows without a confirm published again one at a time, to find that row;
// then a new channel goes on. Any other failure ends the session: the rows
// go back without an attempt.
func (s *session) recover() error {
	e := s.cur
	s.cur = nil
	left := e.finish()
	closeErr := e.ch.closeError()
	if e.err != nil || !s.l.onARow(closeErr) {
		s.c.settle(settlement{unconfirmed: claimedOf(left)})
		switch {
		case e.err != nil:
			return e.err
		case closeErr != nil:
			return fmt.Errorf("channel closed: %w", closeErr)
		}
		return errors.New("the channel closed before every confirm came")
	}
	s.r.log.Warn("the broker closed the outbox relay's channel on a publish; sending the rows without a confirm one at a time to find it",
		"rows", len(left), "err", closeErr)
	if err := s.isolate(left, closeErr); err != nil {
		return err
	}
	var err error
	s.cur, err = s.newEpoch()
	return err
}

// window bounds the rows claimed and not yet settled.
type window struct {
	mu    sync.Mutex
	held  int
	size  int
	freed chan struct{} // room was made
}

func newWindow(size int) *window { return &window{size: size, freed: make(chan struct{}, 1)} }

// fits says whether n more rows fit.
func (w *window) fits(n int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held+n <= w.size
}

func (w *window) take(n int) {
	w.mu.Lock()
	w.held += n
	w.mu.Unlock()
}

func (w *window) give(n int) {
	w.mu.Lock()
	w.held -= n
	w.mu.Unlock()
	signal(w.freed)
}

func claimedOf(rows []inFlight) []Claimed {
	out := make([]Claimed, len(rows))
	for i, f := range rows {
		out[i] = f.c
		f.span.Fail(errors.New("no confirm: the link failed first; the row goes back"))
		f.span.End()
	}
	return out
}
