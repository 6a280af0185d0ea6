package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// DefaultMaxReplays is how often one message may be replayed.
const DefaultMaxReplays = 3

// publishTimeout bounds one replay publish and its confirm.
const publishTimeout = 15 * time.Second

// Selector chooses the dead letters to replay: exactly one field is set.
type Selector struct {
	ID     string // this message id
	Reason string // every message dead-lettered with this reason
	All    bool   // every message
}

// Validate reports a selector that chooses nothing or is ambiguous.
func (s Selector) Validate() error {
	n := 0
	for _, set := range []bool{s.ID != "", s.Reason != "", s.All} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("choose exactly one of a message id, a reason or all")
	}
	return nil
}

func (s Selector) matches(m Message) bool {
	switch {
	case s.All:
		return true
	case s.ID != "":
		return m.ID == s.ID
	}
	return m.Reason == s.Reason
}

// ReplayOptions tune a replay.
type ReplayOptions struct {
	// MaxReplays refuses a message replayed this often already.
	MaxReplays int
	// MaxAge refuses a message older than this, or of unknown age (see
	// Message.Age): the services its handler calls remember idempotency keys
	// for a limited time, and a replay after they forgot the keys repeats
	// side effects that may have happened already (a card charged twice).
	MaxAge time.Duration
	// NoAgeLimit replays messages of any age, unknown included, and ignores
	// MaxAge: for a service whose handler calls no service that remembers
	// idempotency keys (service.Options.NoOutsideCalls).
	NoAgeLimit bool
	// Force replays messages older than MaxAge all the same (not those at the
	// replay cap). Only for messages whose side effects are known not to have
	// happened, or whose keys the services still know.
	Force bool
	// DryRun reports what would be replayed and changes nothing.
	DryRun bool
}

// ReplayReport says what a replay did with each message it looked at.
type ReplayReport struct {
	Depth    int       // messages ready when the replay began; at most this many were visited
	Visited  int       // messages taken from the queue and looked at
	Replayed []Message // back in the work queue (or, with DryRun, would be); Replays is the new count
	Forced   []Message // those of Replayed older than MaxAge, replayed because of Force
	Refused  []Message // selected but at the replay cap: left in the dead-letter queue
	TooOld   []Message // selected but older than MaxAge, without Force: left in the dead-letter queue
	Skipped  int       // not selected: left in the dead-letter queue
}

// Replay moves the selected dead letters back to the work queue with their
// original message id, body and properties, a fresh retry budget and
// x-replay-count raised by one. A selected message at the replay cap is
// refused, and so is one older than MaxAge unless Force: both stay.
//
// Each copy is published with a confirm and the dead letter is acked only
// after that: a crash in between leaves both, and the copy replayed twice is a
// duplicate the inbox suppresses. Messages not replayed are held unacked until
// the end and then returned by closing the channel, normally ready again
// before Replay returns (see List), so no message is taken twice in one run,
// and at most Depth messages are visited: dead letters arriving meanwhile,
// including a replayed message failing again at once, wait for the next run.
//
// On an error Replay stops; the report says what was done until then.
func (q *Queue) Replay(ctx context.Context, sel Selector, opts ReplayOptions) (ReplayReport, error) {
	var rep ReplayReport
	if err := sel.Validate(); err != nil {
		return rep, err
	}
	if opts.MaxReplays < 1 {
		return rep, errors.New("replay: the replay cap must be at least 1")
	}
	if opts.MaxAge <= 0 && !opts.NoAgeLimit {
		return rep, errors.New("replay: the age limit must be positive")
	}
	get, err := q.conn.Channel()
	if err != nil {
		return rep, fmt.Errorf("open channel: %w", err)
	}
	// Returns the messages not replayed, ready again before Replay returns.
	defer func() {
		held := rep.Visited
		if !opts.DryRun {
			held -= len(rep.Replayed) // acked
		}
		q.giveBack(ctx, get, held)
	}()
	if rep.Depth, err = depth(get, q.topo.DeadLetterQueue); err != nil {
		return rep, err
	}
	if _, err := depth(get, q.topo.Queue); err != nil {
		return rep, err
	}
	var pub *rabbit.Publisher
	if !opts.DryRun {
		if pub, err = rabbit.NewPublisher(q.conn); err != nil {
			return rep, err
		}
		defer pub.Close()
	}
	for rep.Visited < rep.Depth {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		d, ok, err := get.Get(q.topo.DeadLetterQueue, false)
		if err != nil {
			return rep, fmt.Errorf("get from %s: %w", q.topo.DeadLetterQueue, err)
		}
		if !ok {
			break
		}
		rep.Visited++
		if err := q.visit(ctx, &rep, sel, opts, pub, d); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (q *Queue) visit(ctx context.Context, rep *ReplayReport, sel Selector, opts ReplayOptions, pub *rabbit.Publisher, d amqp.Delivery) error {
	m := describe(d, q.attrs)
	tooOld := !opts.NoAgeLimit && m.OlderThan(opts.MaxAge, time.Now())
	switch {
	case !sel.matches(m):
		rep.Skipped++
		return nil
	case m.Replays >= opts.MaxReplays:
		rep.Refused = append(rep.Refused, m)
		return nil
	case tooOld && !opts.Force:
		rep.TooOld = append(rep.TooOld, m)
		return nil
	}
	m.Replays++
	if !opts.DryRun {
		if err := q.replay(ctx, pub, d, m.Replays); err != nil {
			return fmt.Errorf("replay message %q: %w", m.ID, err)
		}
	}
	rep.Replayed = append(rep.Replayed, m)
	if tooOld {
		rep.Forced = append(rep.Forced, m)
	}
	return nil
}

// replay publishes the copy to the work queue and acks the dead letter.
//
// The copy goes through the default exchange straight to the work queue, not
// through the original exchange (the x-original-exchange header): on a topic
// exchange it would also reach every other queue bound to the key, and other
// services would receive the event again. The retry queues route back the same
// way. The x-original-* headers stay on the message, so they keep naming where
// it first came from.
func (q *Queue) replay(ctx context.Context, pub *rabbit.Publisher, d amqp.Delivery, replays int) error {
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if err := pub.Publish(pctx, "", q.topo.Queue, replayCopy(d, replays)); err != nil {
		return err
	}
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("copy confirmed but the dead letter not acked (it stays there; a second replay is a duplicate the inbox suppresses): %w", err)
	}
	return nil
}

// resetHeaders are removed from a replayed copy: the runtime's attempt and
// hold counters, so the retry budget and MaxHolds start again, and the
// history of the dead-lettering,
// which the next failure would otherwise report as its own. The broker's
// counters are the dead-letter queue's, not the work queue's.
var resetHeaders = []string{
	wire.HeaderAttempt,
	wire.HeaderPauseHolds,
	wire.HeaderDeadLetterReason,
	wire.HeaderDeadLetterError,
	wire.HeaderDeadLetteredAt,
	wire.HeaderDeadLetterBy,
	wire.HeaderFirstError,
	wire.HeaderLastError,
	"x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
	"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason",
	"x-delivery-count", "x-acquired-count",
}

// replayCopy is d as the producer sent it, plus the replay count. Its message
// id is the inbox key, so a copy of a message already applied is suppressed.
//
// The copy starts a fresh retry budget but keeps (or gains) the mark that it
// may have run, wire.HeaderMayHaveRun: a copy that waits in the work
// queue past the idempotency keys' lifetime must be refused by the runtime's
// key-expiry guard, not run as a first attempt with a key the called
// service has forgotten.
func replayCopy(d amqp.Delivery, replays int) amqp.Publishing {
	p := rabbit.Copy(d)
	if mayHaveRun(d.Headers) {
		p.Headers[wire.HeaderMayHaveRun] = true
	}
	if m := describe(d, nil); !m.Published() && !m.Since.IsZero() {
		// No publish time: the replay's age limit counted from the
		// dead-lettering (or the broker's death record), and so does the
		// runtime's key-expiry guard for the copy.
		p.Headers[wire.HeaderTimestampMillis] = m.Since.UnixMilli()
	}
	// Where it was published, which the copy's delivery through the
	// default exchange will not show: the kit's own headers, or, for a
	// dead letter the broker made itself, its x-death (rabbit.DeathOrigin),
	// read before x-death goes (a service that consumes several events
	// routes the copy by it).
	exchange, key, ok := rabbit.HeaderOrigin(d.Headers)
	if !ok {
		exchange, key, ok = rabbit.DeathOrigin(d.Headers)
	}
	if ok {
		p.Headers[wire.HeaderOriginalExchange], p.Headers[wire.HeaderOriginalKey] = exchange, key
	}
	for _, k := range resetHeaders {
		delete(p.Headers, k)
	}
	p.Headers[HeaderReplayCount] = int32(replays) // #nosec G115 -- capped by --max-replays
	p.Headers[HeaderReplayedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	return p
}

// mayHaveRun reports whether a dead letter may have run: it says so, it was
// tried more than once or put back, the broker dead-lettered it itself (a
// crash loop past the delivery limit), or the runtime dead-lettered it for a
// reason it gives only once the handler may have run. Only a delivery refused
// at the door, marked by nothing else, is known not to have called out.
func mayHaveRun(h amqp.Table) bool {
	_, held := h[wire.HeaderHeld]
	_, brokerDeath := h["x-death"]
	reason := stringHeader(h, wire.HeaderDeadLetterReason)
	return wire.MarkedAsRun(h) || held || brokerDeath || intHeader(h, wire.HeaderAttempt) > 1 ||
		!wire.RefusedBeforeRun(reason)
}
