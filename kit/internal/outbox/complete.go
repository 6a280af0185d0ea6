package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inbox-template/payment-service/kit/tracing"
	"github.com/inbox-template/payment-service/kit/wire"
)

// settlement is what became of rows the relay claimed.
type settlement struct {
	sent        []Claimed // confirmed, and taken by a queue if mandatory
	unconfirmed []Claimed // no confirm: the link failed first; back without an attempt
	failed      []failed  // an attempt spent
}

func (st settlement) rows() int { return len(st.sent) + len(st.unconfirmed) + len(st.failed) }

// failed is a row whose publish failed for a reason of its own.
type failed struct {
	c             Claimed
	span          tracing.Span
	reason, cause string
	err           error // for its span; nil: cause
	park          bool  // it can never be published: parked at once
}

// completer applies settlements to the table, in the order they come, one
// goroutine per session. What arrives while it applies the last is applied
// next in one go: the confirmed rows of several flights take one mark.
type completer struct {
	r    *Relay
	win  *window
	in   chan settlement
	done chan struct{}
}

// markMax bounds the rows of one mark.
const markMax = 2000

func (r *Relay) startCompleter(win *window) *completer {
	c := &completer{r: r, win: win, in: make(chan settlement, 2*claimsInFlight+2), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *completer) settle(st settlement) {
	if st.rows() > 0 {
		c.in <- st
	}
}

// stop applies what was handed over, then returns.
func (c *completer) stop() {
	close(c.in)
	<-c.done
}

func (c *completer) run() {
	defer close(c.done)
	for st := range c.in {
		for more := true; more && len(st.sent) < markMax; {
			select {
			case next, ok := <-c.in:
				if !ok {
					more = false
					break
				}
				st.sent = append(st.sent, next.sent...)
				st.unconfirmed = append(st.unconfirmed, next.unconfirmed...)
				st.failed = append(st.failed, next.failed...)
			default:
				more = false
			}
		}
		c.apply(st)
		c.win.give(st.rows())
	}
}

// apply records a settlement, detached from shutdown.
func (c *completer) apply(st settlement) {
	r := c.r
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if r.cfg.OnPublished != nil && len(st.sent) > 0 {
		r.cfg.OnPublished()
	}
	if n, due, err := r.markSent(ctx, st.sent); err != nil {
		r.log.Error("rows confirmed by the broker but not marked sent: they will be published again, with the same ids, once their lease ends",
			"rows", len(st.sent), "err", err)
	} else {
		r.metrics.published.WithLabelValues(r.store.Producer()).Add(float64(n))
		if due > 0 {
			signal(r.due)
		}
	}
	if err := r.store.Release(ctx, st.unconfirmed, 0); err != nil {
		r.log.Error("could not release unconfirmed rows; their lease ends by itself", "rows", len(st.unconfirmed), "err", err)
	}
	for _, f := range st.failed {
		r.fail(ctx, f)
		if f.err == nil {
			f.err = errors.New(f.cause)
		}
		f.span.Fail(f.err)
		f.span.End()
	}
}

// markSent marks the confirmed rows, trying again at once when the
// database broke a deadlock against it or a lock wait timed out: a
// transaction that emits to several ordering keys in separate Enqueue calls
// locks them in the order of its calls, the mark in key order, and
// PostgreSQL ends such a cycle by aborting one side. Given up, the rows are
// published again once their lease ends.
func (r *Relay) markSent(ctx context.Context, rows []Claimed) (marked, due int, err error) {
	for try := 1; ; try++ {
		marked, due, err = r.store.MarkSent(ctx, rows)
		var pg *pgconn.PgError
		if err == nil || try == 5 || !errors.As(err, &pg) || (pg.Code != "40P01" && pg.Code != "55P03") {
			return marked, due, err
		}
		r.log.Warn("marking rows sent lost a deadlock or a lock wait; marking them again", "rows", len(rows), "try", try, "err", err)
		if !sleep(ctx, time.Duration(try)*20*time.Millisecond) {
			return 0, 0, err
		}
	}
}

// fail records a failed publish: due again after the row's next retry
// delay, or parked once its attempts are spent (at once if it can never be
// published).
func (r *Relay) fail(ctx context.Context, f failed) {
	c := f.c
	delay := r.cfg.RetryDelays[min(c.Attempts, len(r.cfg.RetryDelays)-1)]
	maxAttempts := r.cfg.MaxAttempts
	if f.park {
		maxAttempts = c.Attempts + 1
	}
	parked, err := r.store.Fail(ctx, c, delay, maxAttempts, f.reason, f.cause)
	log := r.log.With("outbox_id", c.ID, "exchange", wire.ErrorText(c.Exchange), "routing_key", wire.ErrorText(c.RoutingKey), "ordering_key", c.OrderingKey,
		"attempt", c.Attempts+1, "reason", f.reason)
	switch {
	case err != nil:
		log.Error("could not record a failed publish; the lease ends by itself", "err", err, "cause", f.cause)
	case parked:
		r.metrics.failures.WithLabelValues(r.store.Producer(), f.reason).Inc()
		log.Error("outbox row parked: it waits for an operator (outbox parked, outbox retry); its key's later rows wait behind it", "cause", f.cause)
	default:
		r.metrics.failures.WithLabelValues(r.store.Producer(), f.reason).Inc()
		log.Warn("outbox publish failed; retry scheduled", "delay", delay.String(), "cause", f.cause)
	}
}
