package consumer

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
	"github.com/inbox-template/payment-service/kit/wire"
)

// mover moves a delivery on the broker: a copy to a delay queue (a retry, a
// hold), to the dead-letter exchange, or back to the work queue, each
// published and confirmed before the original is acked.
type mover struct {
	cfg     *Config
	metrics *Metrics
	log     *slog.Logger
	door    *door // the logger of a message returned unstarted
}

// publishTimeout bounds a retry or dead-letter publish and its confirm.
const publishTimeout = 15 * time.Second

// retryJitter shortens each delay by up to this fraction. Retry queues expire
// messages at the head only, so a jittered message waits at most this much
// longer than its own expiration behind an earlier one.
const retryJitter = 0.2

// retry republishes the message to the delay queue of its attempt with the
// attempt counter raised, then acks the original. If the copy is not confirmed
// the original is requeued instead: a duplicate is possible, a loss is not.
func (mv *mover) retry(ctx context.Context, s *session, d amqp.Delivery, msg Message, cause error, log *messageLog) {
	delay := retryDelay(mv.cfg.Topology.RetryDelays, msg.Attempt)
	pub := republish(d, msg)
	pub.Headers[wire.HeaderAttempt] = header32(msg.Attempt + 1)
	pub.Headers[wire.HeaderLastError] = wire.ErrorText(cause.Error())
	if _, ok := pub.Headers[wire.HeaderFirstError]; !ok {
		pub.Headers[wire.HeaderFirstError] = wire.ErrorText(cause.Error())
	}
	expire := time.Duration(float64(delay) * (1 - retryJitter*rand.Float64()))
	pub.Expiration = strconv.FormatInt(max(expire.Milliseconds(), 1), 10)
	queue := mv.cfg.Topology.RetryQueue(delay)
	if !mv.publishThenAck(ctx, s, d, "", queue, pub, log) {
		return
	}
	mv.metrics.messages.WithLabelValues(mv.cfg.Name, string(OutcomeRetried)).Inc()
	log.get().Warn("message failed; retry scheduled", "attempt", msg.Attempt, "max_attempts", mv.cfg.MaxAttempts,
		"delay", expire.String(), "err", cause)
}

// hold puts a message that failed through no fault of its own (the database
// or a dependency is down) back without spending an attempt: a copy goes to
// the first delay queue with its attempt count unchanged, then the original is
// acked. Unlike a nack with requeue, the copy is a new message to the broker,
// so the work queue's x-delivery-limit never counts an outage against it.
// counts raises the holds that count against MaxHolds (a pause the service's
// code asked for).
func (mv *mover) hold(ctx context.Context, s *session, d amqp.Delivery, msg Message, cause error, counts bool, log *messageLog) {
	delay := mv.cfg.Topology.RetryDelays[0]
	pub := republish(d, msg)
	pub.Headers[wire.HeaderAttempt] = header32(msg.Attempt)
	held, _ := intHeader(d.Headers, wire.HeaderHeld)
	pub.Headers[wire.HeaderHeld] = header32(held + 1)
	if counts {
		pub.Headers[wire.HeaderPauseHolds] = header32(msg.holds + 1)
	}
	pub.Headers[wire.HeaderLastError] = wire.ErrorText(cause.Error())
	pub.Expiration = strconv.FormatInt(max(delay.Milliseconds(), 1), 10)
	if mv.publishThenAck(ctx, s, d, "", mv.cfg.Topology.RetryQueue(delay), pub, log) {
		mv.metrics.messages.WithLabelValues(mv.cfg.Name, string(OutcomeRequeued)).Inc()
	}
}

// returnUnstarted gives back the deliveries a session received but no worker
// started: each is republished to the work queue and then acked. Left to the
// channel's close, the broker would requeue them and a quorum queue would
// count each return in x-delivery-count, so that enough restarts, pauses or
// deploys would dead-letter valid messages (delivery_limit) that never failed.
func (mv *mover) returnUnstarted(ctx context.Context, s *session, deliveries <-chan amqp.Delivery) {
	n := 0
	for d := range deliveries {
		msg := Message{ID: d.MessageId, Body: d.Body}
		log := &messageLog{door: mv.door, msg: &msg, tag: d.DeliveryTag, redelivered: d.Redelivered}
		pub := rabbit.Copy(d)
		stampSeen(pub.Headers, publishedAt(d), time.Now())
		// It comes back through the default exchange under the queue's
		// name: it carries where it was published, as every copy does.
		if exchange, key, ok := rabbit.Origin(d); ok {
			pub.Headers[wire.HeaderOriginalExchange], pub.Headers[wire.HeaderOriginalKey] = exchange, key
		}
		if d.Redelivered {
			// It may have run in a replica that died: the copy is a new
			// message to the broker, without the redelivered flag.
			pub.Headers[wire.HeaderMayHaveRun] = true
		}
		if mv.publishThenAck(ctx, s, d, "", mv.cfg.Topology.Queue, pub, log) {
			n++
		}
	}
	if n > 0 {
		mv.log.Info("returned unstarted deliveries to the work queue", "count", n)
	}
}

// retryDelay is the delay after a failed attempt (1-based): the n-th delay,
// the last one repeating.
func retryDelay(delays []time.Duration, attempt int) time.Duration {
	return delays[min(max(attempt, 1)-1, len(delays)-1)]
}

// deadLetter publishes the message to the dead-letter exchange with the reason
// and last error in its headers, then acks the original. A broker-side reject
// could not add those headers.
func (mv *mover) deadLetter(ctx context.Context, s *session, d amqp.Delivery, msg Message, reason Reason, cause error, log *messageLog) {
	pub := republish(d, msg)
	if reason == reasonHeadersTooLarge {
		// The producer's headers are what does not fit: the copy keeps the
		// publish time and the trace, and says how much it left out.
		kept := amqp.Table{wire.HeaderHeadersDropped: int64(rabbit.HeaderFrameSize(rabbit.Copy(d)))}
		for _, k := range []string{wire.HeaderTimestampMillis, "traceparent", "tracestate", wire.HeaderOriginalExchange, wire.HeaderOriginalKey} {
			if v, ok := pub.Headers[k]; ok {
				kept[k] = v
			}
		}
		pub.Headers = kept
	}
	pub.Headers[wire.HeaderDeadLetterReason] = reason.String()
	pub.Headers[wire.HeaderDeadLetterError] = wire.ErrorText(cause.Error())
	pub.Headers[wire.HeaderDeadLetteredAt] = time.Now().UTC().Format(time.RFC3339Nano)
	pub.Headers[wire.HeaderDeadLetterBy] = mv.cfg.Name
	pub.Headers[wire.HeaderAttempt] = header32(msg.Attempt)
	if _, ok := pub.Headers[wire.HeaderFirstError]; !ok {
		pub.Headers[wire.HeaderFirstError] = wire.ErrorText(cause.Error())
	}
	t := mv.cfg.Topology
	if !mv.publishThenAck(ctx, s, d, t.DeadLetterExchange, t.DeadLetterKey(), pub, log) {
		return
	}
	mv.metrics.messages.WithLabelValues(mv.cfg.Name, string(OutcomeDeadLettered)).Inc()
	mv.metrics.deadLetters.WithLabelValues(mv.cfg.Name, reason.String()).Inc()
	log.get().Error("message dead-lettered", "reason", reason, "attempt", msg.Attempt, "err", cause)
}

func (mv *mover) publishThenAck(ctx context.Context, s *session, d amqp.Delivery, exchange, key string, pub amqp.Publishing, log *messageLog) bool {
	if err := s.waitUnblocked(ctx); err != nil {
		// Shutting down: the original stays unacked and is redelivered.
		tracing.FromContext(ctx).Moved("abandoned", err)
		return false
	}
	if err := rabbit.CheckPublishing(exchange, key, pub, s.pubConn.Config.FrameSize); err != nil {
		mv.rejectUncopyable(s, d, err, log)
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if err := s.publish.Publish(pctx, exchange, key, pub); err != nil {
		tracing.FromContext(ctx).Moved(string(OutcomeRequeued), err)
		log.get().Warn("could not move the message; requeueing it", "exchange", exchange, "routing_key", key, "err", err)
		if errors.Is(err, rabbit.ErrReturned) {
			s.requestRedeclare() // a queue is gone: the next session declares it again
		}
		sleep(ctx, time.Second) // the broker will not route it any better right away
		if d.Nack(false, true) == nil {
			s.acks.settled(d.DeliveryTag)
		}
		return false
	}
	if err := mv.settle(ctx, s, d.DeliveryTag); err != nil {
		tracing.FromContext(ctx).Moved("copied_unacked", err) // copied, and redelivered as well
		log.get().Warn("ack failed after the copy was confirmed; the redelivery will repeat this step", "err", err)
		return false
	}
	return true
}

// rejectUncopyable gives a delivery no copy of which can be sent (its
// properties and headers, with the runtime's own, do not fit in one frame:
// the broker would close the publishing connection on it, at every try, and
// every message in flight with it) to the broker's own dead-lettering: a
// reject without requeue takes it to the dead-letter queue, its x-death
// saying why, without the runtime's headers.
func (mv *mover) rejectUncopyable(s *session, d amqp.Delivery, err error, log *messageLog) {
	log.get().Error("no copy of the message can be sent; rejected to the work queue's dead-letter exchange (x-death, no reason headers)",
		"reason", wire.ReasonHeadersTooLarge, "err", err)
	if d.Reject(false) == nil {
		s.acks.settled(d.DeliveryTag)
		mv.metrics.messages.WithLabelValues(mv.cfg.Name, string(OutcomeDeadLettered)).Inc()
		mv.metrics.deadLetters.WithLabelValues(mv.cfg.Name, wire.ReasonHeadersTooLarge).Inc()
	}
}

// republish copies a delivery for a retry or dead-letter publish, keeping its
// properties and its message id (the inbox key, resolved from the body if need
// be), and marking it wire.HeaderMayHaveRun if it may have run.
func republish(d amqp.Delivery, msg Message) amqp.Publishing {
	p := rabbit.Copy(d)
	p.MessageId = msg.ID
	if msg.MayHaveRun() {
		p.Headers[wire.HeaderMayHaveRun] = true
	}
	stampSeen(p.Headers, msg.PublishedAt, msg.seenAt)
	delete(p.Headers, "x-death")             // the broker's own history; ours is in x-attempt
	delete(p.Headers, wire.HeaderPauseHolds) // a producer's is not ours: the copy carries the count the runtime trusts
	if msg.holds > 0 {
		p.Headers[wire.HeaderPauseHolds] = header32(msg.holds)
	}
	// Where it was published (rabbit.Origin: a producer's own headers are
	// not taken for it), for its return from a retry queue or a replay; an
	// origin unknown is not made up.
	delete(p.Headers, wire.HeaderOriginalExchange)
	delete(p.Headers, wire.HeaderOriginalKey)
	if msg.Exchange != "" {
		p.Headers[wire.HeaderOriginalExchange], p.Headers[wire.HeaderOriginalKey] = msg.Exchange, msg.RoutingKey
	}
	return p
}

// stampSeen gives a copy of a message that has no publish time the time the
// runtime first received it, as its publish time (wire.HeaderTimestampMillis):
// the key-expiry guard counts a message's age from its publish time, and a
// copy without one would pass it at any age. The first receipt bounds the
// message's first outside call from below, as a publish time does.
func stampSeen(h amqp.Table, published, seen time.Time) {
	if published.IsZero() && !seen.IsZero() {
		h[wire.HeaderTimestampMillis] = seen.UnixMilli()
	}
}

// header32 is n as the int32 an AMQP header count takes, clamped: a count
// read from a producer's headers may be anything.
func header32(n int) int32 {
	return int32(max(min(n, math.MaxInt32), math.MinInt32)) // #nosec G115 -- clamped to the int32 range
}
