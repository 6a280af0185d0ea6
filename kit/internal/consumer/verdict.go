package consumer

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// settler settles one failed message in its mode's terms; carryOut decides
// which of its ways, in one place for both modes.
type settler interface {
	// abandon leaves the message as it is at a stop (inline: unacked, for
	// the broker to redeliver; buffered: released for another replica).
	abandon(err error)
	// end ends the message with reason (inline: the dead-letter exchange;
	// buffered: parked, its key blocked); it traces the end itself.
	end(reason Reason, err error)
	// putBack gives the message back without spending its attempt; counts:
	// the hold counts against its MaxHolds.
	putBack(err error, counts bool)
	// retry spends the attempt and schedules the next.
	retry(err error)
	// pause asks the mode to stop taking messages, for cause.
	pause(cause Cause)
	// words name the mode's ways of putting back and abandoning, for the log.
	words() (putBack, abandoned string)
}

// carryOut carries out the verdict on a message whose run failed with err:
// the trace and the log say the same in both modes, and only the settling is
// the mode's (settler).
func (r *Runtime) carryOut(v verdict, st settler, err error, span tracing.Span, log *messageLog, attempt, holds int) {
	if v.act != actDeadLetter {
		span.Outcome(v.outcome(), attempt)
		span.FailAs(err, v.errorType())
	}
	putBack, abandoned := st.words()
	switch v.act {
	case actAbandon:
		log.get().Warn("abandoned at shutdown; "+abandoned, "err", err)
		st.abandon(err)
	case actDeadLetter:
		st.end(v.reason, err)
	case actPutBack:
		log.get().Warn("waited too long on a lock or a conflict: "+putBack+" without spending an attempt",
			"attempt", attempt, "err", err)
		st.putBack(err, false)
	case actPause:
		log.get().Warn("not the message's fault: "+putBack+" without spending an attempt and pausing",
			"cause", v.cause, "messages_failing_in_a_row", r.judge.failures.len(), "attempt", attempt,
			"pause_holds", holds, "max_holds", r.cfg.MaxHolds, "err", err)
		st.putBack(err, v.counts)
		st.pause(v.cause)
	case actRetry:
		st.retry(err)
	}
}

// inlineSettler settles a delivery on the broker.
type inlineSettler struct {
	r    *Runtime
	ctx  context.Context
	s    *session
	d    amqp.Delivery
	msg  Message
	log  *messageLog
	span tracing.Span
}

func (st inlineSettler) abandon(error) {} // the transaction rolled back; unacked, it is redelivered
func (st inlineSettler) end(reason Reason, err error) {
	st.span.Outcome(string(OutcomeDeadLettered), st.msg.Attempt)
	st.span.FailAs(err, reason.String())
	st.r.mover.deadLetter(st.ctx, st.s, st.d, st.msg, reason, err, st.log)
}
func (st inlineSettler) putBack(err error, counts bool) {
	st.r.mover.hold(st.ctx, st.s, st.d, st.msg, err, counts, st.log)
}
func (st inlineSettler) retry(err error)   { st.r.mover.retry(st.ctx, st.s, st.d, st.msg, err, st.log) }
func (st inlineSettler) pause(cause Cause) { st.s.requestPause(cause) }
func (st inlineSettler) words() (string, string) {
	return "putting it back", "will be redelivered"
}

// bufferedSettler settles a claimed message in the store.
type bufferedSettler struct {
	p    *processor
	c    buffered.Claimed
	log  *messageLog
	span tracing.Span
}

func (st bufferedSettler) abandon(err error) { st.p.release(st.c, err, false, st.log) }
func (st bufferedSettler) end(reason Reason, err error) {
	st.span.Outcome(string(OutcomeParked), st.c.Attempts)
	st.span.FailAs(err, reason.String())
	st.p.park(st.c, reason, err, st.log)
}
func (st bufferedSettler) putBack(err error, counts bool) { st.p.release(st.c, err, counts, st.log) }
func (st bufferedSettler) retry(err error)                { st.p.failed(st.c, err, st.log) }
func (st bufferedSettler) pause(cause Cause)              { st.p.requestPause(cause) }
func (st bufferedSettler) words() (string, string) {
	return "releasing it", "released for another replica"
}
