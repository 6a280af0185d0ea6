package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/wire"
)

// The ingest of the buffered mode. One loop per session takes the deliveries
// in the order the broker sends them and stores them in batches of up to
// GroupCommitMax, one short transaction each, in that order; then it acks
// them. A single loop keeps the broker's order: several workers would store
// the messages of one key in whatever order they happened to finish. Storing
// is cheap (no outside call), so one loop and group commit keep up.

// ingested is a delivery admitted for storing.
type ingested struct {
	d   amqp.Delivery
	msg Message
	log *messageLog
	in  buffered.Incoming
}

// ingestLoop stores the deliveries of a session until stop is closed or the
// channel is gone.
func (b *bufferedMode) ingestLoop(ctx context.Context, s *session, deliveries <-chan amqp.Delivery, stop <-chan struct{}) {
	r := b.r
	for {
		select { // a closed stop wins over a ready delivery
		case <-stop:
			return
		default:
		}
		var first amqp.Delivery
		var ok bool
		select {
		case <-stop:
			return
		case first, ok = <-deliveries:
			if !ok {
				return
			}
		}
		batch := r.gatherDeliveries(first, deliveries)
		done := r.track()
		b.ingestBatch(ctx, s, batch)
		done()
		if s.ending() {
			// A batch failed: what follows it stays unacked, and the
			// channel's close gives it back in order with the failed one.
			return
		}
	}
}

// gatherDeliveries collects what is waiting behind first, then what arrives
// within GroupCommitWait, up to GroupCommitMax.
func (r *Runtime) gatherDeliveries(first amqp.Delivery, deliveries <-chan amqp.Delivery) []amqp.Delivery {
	batch := []amqp.Delivery{first}
	for len(batch) < r.cfg.GroupCommitMax {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
			continue
		default:
		}
		break
	}
	if len(batch) == r.cfg.GroupCommitMax || r.cfg.GroupCommitWait == 0 {
		return batch
	}
	timer := time.NewTimer(r.cfg.GroupCommitWait)
	defer timer.Stop()
	for len(batch) < r.cfg.GroupCommitMax {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch
			}
			batch = append(batch, d)
		case <-timer.C:
			return batch
		}
	}
	return batch
}

// ingestRest stores what the broker sent before a cancel took effect, until
// the channel of deliveries closes, so that a graceful stop leaves nothing
// prefetched to return. It stops when a batch fails (the rest goes back with
// the channel's close, in order) or when ctx ends (likewise).
func (b *bufferedMode) ingestRest(ctx context.Context, s *session, deliveries <-chan amqp.Delivery) {
	r := b.r
	n := 0
	for d := range deliveries {
		if ctx.Err() != nil || s.ending() {
			return
		}
		batch := r.gatherDeliveries(d, deliveries)
		b.ingestBatch(ctx, s, batch)
		n += len(batch)
	}
	if n > 0 {
		r.log.Info("stored the deliveries that arrived while stopping", "count", n)
	}
}

// ingestBatch admits each delivery (dead-lettering those the runtime refuses)
// and stores the rest. Nothing is stored once the session is ending: a
// delivery after one that could not be stored must not be stored before it.
func (b *bufferedMode) ingestBatch(ctx context.Context, s *session, batch []amqp.Delivery) {
	items := make([]ingested, 0, len(batch))
	for _, d := range batch {
		if it, ok := b.admitForIngest(ctx, s, d); ok {
			items = append(items, it)
		}
	}
	if len(items) == 0 {
		return
	}
	if s.ending() {
		return
	}
	b.store(ctx, s, items)
}

// admitForIngest applies the runtime's checks and resolves the dedupe key and
// the ordering key. A panic in a cloner's Decoder, KeyFromBody, LogAttrs or
// OrderingKey rejects the delivery without requeue, as inline.
func (b *bufferedMode) admitForIngest(ctx context.Context, s *session, d amqp.Delivery) (it ingested, ok bool) {
	r := b.r
	defer func() {
		if v := recover(); v != nil {
			r.metrics.panics.WithLabelValues(r.cfg.Name).Inc()
			r.log.Error("panic outside the handler; rejecting the delivery to the dead-letter exchange",
				"message_id", d.MessageId, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if d.Reject(false) == nil {
				s.acks.settled(d.DeliveryTag)
			}
			ok = false
		}
	}()
	msg := r.door.received(d)
	reason, err := r.door.admit(d, &msg)
	log := &messageLog{door: &r.door, msg: &msg, tag: d.DeliveryTag, redelivered: d.Redelivered}
	if !reason.isZero() {
		r.deadLetterAside(ctx, s, d, msg, reason, err, log)
		return it, false
	}
	key := msg.orderingKey
	if b.cfg.OrderingKey != nil {
		key = b.cfg.OrderingKey(d.Body)
	}
	if !validKey(key) {
		r.deadLetterAside(ctx, s, d, msg, reasonInvalidOrderingKey,
			errors.New("ordering key is longer than 255 bytes, not UTF-8, or holds a control character"), log)
		return it, false
	}
	headers := maps.Clone(d.Headers)
	if headers == nil {
		headers = amqp.Table{}
	}
	if msg.MayHaveRun() {
		// Stored, the message loses the redelivered flag and the attempt
		// count: the mark keeps what they said for the key-expiry guard.
		headers[wire.HeaderMayHaveRun] = true
	}
	// Stored, it loses its delivery's exchange and routing key too: the
	// processing routes it by these (a service that consumes several
	// events). Set from the delivery, never a producer's headers; an origin
	// unknown is not stored (the service's first event's, as Routed has it).
	delete(headers, wire.HeaderOriginalExchange)
	delete(headers, wire.HeaderOriginalKey)
	if msg.Exchange != "" {
		headers[wire.HeaderOriginalExchange], headers[wire.HeaderOriginalKey] = msg.Exchange, msg.RoutingKey
	}
	return ingested{d: d, msg: msg, log: log, in: buffered.Incoming{
		MessageID: msg.ID, OrderingKey: key, ContentType: d.ContentType, Headers: headers, Body: d.Body,
		PublishedAt: msg.PublishedAt,
	}}, true
}

// validKey reports whether k can be an ordering key: "" (a key of its own),
// or what an id can be.
func validKey(k string) bool { return k == "" || validID(k) }

// store commits a batch and acks each delivery after the commit. A batch
// that fails is never rerouted: a copy in a delay queue, or one republished to
// the work queue, would be stored after messages of its key that came later.
// The database's trouble pauses the session; a wait on a lock, or a fault
// that is not the data's, is tried again in place and then ends the session;
// either way the failed deliveries and everything after them stay unacked,
// and the channel's close gives them back to the queue in its order. A batch
// that fails otherwise is tried again message by message, so that the
// failure stays with the message at fault, which is dead-lettered.
func (b *bufferedMode) store(ctx context.Context, s *session, items []ingested) {
	b.storeTry(ctx, s, items, 0)
}

// ingestRetries is how often a batch that waited on a lock, or failed for no
// reason of its data, is tried again in place before the session ends:
// after ingestRetryDelay, doubling (15.5 s of pauses in all, plus the waits).
// In place, the deliveries stay in hand and nothing after them is stored, so
// the order holds and the broker counts nothing; a session's end costs every
// delivery then prefetched one count against QUEUE_DELIVERY_LIMIT.
const (
	ingestRetries    = 5
	ingestRetryDelay = 500 * time.Millisecond
)

func (b *bufferedMode) storeTry(ctx context.Context, s *session, items []ingested, tries int) {
	r := b.r
	in := make([]buffered.Incoming, len(items))
	for i, it := range items {
		in[i] = it.in
	}
	tctx, cancel := context.WithTimeout(ctx, applyMargin)
	results, err := b.cfg.Store.Ingest(tctx, in, func() { r.stage(StageInboxInsert) })
	cancel()
	if err != nil {
		b.storeFailed(ctx, s, items, failedAt(stepCommit, err), tries)
		return
	}
	b.proc.ingested()
	// The stored (and the already stored) are acked together: one multiple
	// ack where their tags reach from the lowest unsettled one.
	tags := make([]uint64, 0, len(items))
	for i, it := range items {
		if errors.Is(results[i].Err, buffered.ErrPayloadMismatch) {
			r.deadLetterAside(ctx, s, it.d, it.msg, reasonPayloadMismatch, results[i].Err, it.log)
			continue
		}
		r.stage(StageCommit)
		tags = append(tags, it.d.DeliveryTag)
	}
	if len(tags) == 0 {
		return
	}
	ackErr := s.acks.ack(tags...)
	for i, it := range items {
		switch {
		case errors.Is(results[i].Err, buffered.ErrPayloadMismatch):
		case results[i].Fresh:
			r.acked(it.msg, OutcomeStored, it.log, ackErr)
		default:
			r.acked(it.msg, OutcomeDuplicate, it.log, ackErr)
		}
	}
}

func (b *bufferedMode) storeFailed(ctx context.Context, s *session, items []ingested, err error, tries int) {
	r := b.r
	switch {
	case ctx.Err() != nil:
		r.abandon(s, items, err)
		return
	case len(items) > 1 && pauseCause(err).isZero() && !waited(err):
		for _, it := range items {
			if s.ending() {
				return // a message before this one is going back to the queue
			}
			b.store(ctx, s, []ingested{it})
		}
		return
	}
	if cause := r.judge.infrastructure(ctx, err); !cause.isZero() {
		for _, it := range items {
			it.log.get().Warn("not the message's fault: leaving it unacked for the queue to take back, in order, and pausing",
				"cause", cause, "err", err)
		}
		s.requestPause(cause)
		return
	}
	// The ingest's statements are the runtime's own and the same for every
	// message: a data exception or an integrity violation (SQLSTATE classes
	// 22 and 23) comes from this message's data (a trigger of the cloner's, a
	// constraint added to the table), and trying it again would stall the
	// queue behind it: it is dead-lettered. A wait on a lock or a conflict,
	// and anything else (an internal error, a schema half migrated, a row
	// pruned under the ingest's feet), may pass: the batch is tried again in
	// place, then the session ends and the broker takes the deliveries back
	// in order; a fault that stays spends the broker's delivery limit, not
	// the whole queue at ingest speed.
	if waited(err) || !dataFault(err) {
		if tries < ingestRetries && !closed(s.stop) {
			delay := ingestRetryDelay << tries
			r.log.Warn("storing a batch failed, not for its data: trying it again in place, the deliveries after it waiting",
				"messages", len(items), "try", tries+1, "delay", delay.String(), "err", err)
			if !sleepUnless(ctx, s.stop, delay) {
				r.abandon(s, items, err)
				return
			}
			b.storeTry(ctx, s, items, tries+1)
			return
		}
		for _, it := range items {
			it.log.get().Warn("could not be stored: leaving it unacked for the queue to take back, in order, and reconnecting", "err", err)
		}
		s.requestEnd(fmt.Errorf("ingest failed %d times; reconnecting to take the messages again in order: %w", tries+1, err))
		return
	}
	it := items[0]
	r.deadLetterAside(ctx, s, it.d, it.msg, reasonIngestFailed, err, it.log)
}

// abandon leaves a batch unstored and unacked because the session is
// stopping, and ends the session: nothing after it may be stored in this
// session (ingestRest stores what a graceful stop left over), and the
// channel's close gives the batch back in the queue's order.
func (r *Runtime) abandon(s *session, items []ingested, err error) {
	for _, it := range items {
		it.log.get().Warn("abandoned unstored as the session stops; the broker takes it back, in order", "err", err)
	}
	s.requestEnd(fmt.Errorf("a batch was abandoned unstored: %w", err))
}

// sleepUnless waits for d, and reports false if ctx ended or stop closed first.
func sleepUnless(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}

// dataFault reports an SQLSTATE of the message's data: a data exception or an
// integrity constraint violation.
func dataFault(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (strings.HasPrefix(pg.Code, "22") || strings.HasPrefix(pg.Code, "23"))
}

// deadLetterAside dead-letters a delivery off the ingest loop. Under a broker
// memory or disk alarm the copy waits for the publishing connection to be
// unblocked; the ingest must go on storing and acking meanwhile (the messages
// it takes off the queue are what clears the alarm), as inline the other
// workers do while one waits. The session waits for these before it closes.
func (r *Runtime) deadLetterAside(ctx context.Context, s *session, d amqp.Delivery, msg Message, reason Reason, cause error, log *messageLog) {
	s.aside.Go(func() { r.mover.deadLetter(ctx, s, d, msg, reason, cause, log) })
}
