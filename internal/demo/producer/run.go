package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// ErrReturned means the broker returned messages as unroutable: no queue was
// bound to the exchange with the routing key.
var ErrReturned = errors.New("returned by the broker as unroutable")

// Config is one run: where to publish, what, and how fast.
type Config struct {
	Broker Broker
	Load   Load
	Rate   float64 // messages per second; 0 means as fast as confirms allow
	Window int     // outstanding confirms; 0 means DefaultWindow
	// Tracer, if set, makes each message's publish a producer span whose
	// context its headers carry (traceparent): the root of its trace.
	Tracer *tracing.Tracer
}

// Run publishes the load and reports what happened. It returns an error unless
// the broker confirmed every message and returned none; the summary is
// complete in either case.
func Run(ctx context.Context, cfg Config, log *slog.Logger) (Summary, error) {
	start := time.Now()
	sum := newSummary(cfg)
	if err := cfg.validate(); err != nil {
		return sum, fail(&sum, err)
	}
	c, err := newConfirmer(ctx, cfg.Broker, cfg.Window, log)
	if err != nil {
		return sum, fail(&sum, err)
	}
	c.tracer = cfg.Tracer
	err = publishAll(ctx, cfg, c, &sum)
	c.settleArrived()
	c.close()
	sum.Confirmed, sum.Nacked, sum.Returned = c.confirmed, c.nacked, c.returns.count()
	sum.Reconnects, sum.RepublishedAfterReconnect = c.reconnects, c.resent
	sum.DurationSeconds = time.Since(start).Seconds()
	return sum, fail(&sum, verdict(cfg.Broker, sum, err))
}

func (cfg Config) validate() error {
	if err := cfg.Load.Validate(); err != nil {
		return err
	}
	if !(cfg.Rate >= 0) {
		return fmt.Errorf("rate must not be negative, got %v", cfg.Rate)
	}
	return nil
}

// publishAll publishes the load, then waits for the remaining confirms. It
// stops at the first returned message: with nothing bound, the rest would be
// returned too.
func publishAll(ctx context.Context, cfg Config, c *confirmer, sum *Summary) error {
	pace := newPacer(cfg.Rate)
	for m := range cfg.Load.Messages() {
		if c.returns.count() > 0 {
			break
		}
		if err := pace.wait(ctx); err != nil {
			return fmt.Errorf("wait for the rate limit: %w", err)
		}
		sum.count(m) // before publishing: a failed publish still counts as unconfirmed
		if err := c.publish(ctx, m); err != nil {
			return err
		}
	}
	return c.flush(ctx)
}

// verdict turns the counts into the run's error, most actionable first.
func verdict(b Broker, sum Summary, err error) error {
	switch {
	case sum.Returned > 0:
		return fmt.Errorf("no queue bound to exchange %s with key %s: start payment-service first: %d message(s) %w",
			b.Exchange, b.RoutingKey, sum.Returned, ErrReturned)
	case err != nil:
		return fmt.Errorf("stopped after publishing %d messages, %d confirmed: %w", sum.Published, sum.Confirmed, err)
	case sum.Nacked > 0:
		return fmt.Errorf("%d message(s): %w", sum.Nacked, rabbit.ErrNotConfirmed)
	case sum.Confirmed != sum.Published:
		return fmt.Errorf("only %d of %d messages confirmed: %w", sum.Confirmed, sum.Published, rabbit.ErrNotConfirmed)
	}
	return nil
}

// fail records err in the summary and returns it.
func fail(sum *Summary, err error) error {
	sum.OK = err == nil
	if err != nil {
		sum.Error = err.Error()
	}
	return err
}

// pacer spaces publishes evenly to stay under a rate.
type pacer struct {
	interval time.Duration
	next     time.Time
}

func newPacer(perSecond float64) *pacer {
	if perSecond <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / perSecond)}
}

func (p *pacer) wait(ctx context.Context) error {
	if p.interval == 0 {
		return ctx.Err()
	}
	now := time.Now()
	if err := sleep(ctx, p.next.Sub(now)); err != nil {
		return err
	}
	// After a stall (a reconnect) start afresh instead of bursting to catch up.
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(p.interval)
	return nil
}
