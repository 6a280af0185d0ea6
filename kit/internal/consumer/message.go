package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// door is where a delivery becomes a message: the checks every handler
// needs before a body is trusted, the decode, the dedupe key, and the
// message's logger.
type door struct {
	cfg      *Config
	metrics  *Metrics
	log      *slog.Logger
	frameMax *atomic.Int64 // the publishing connection's frame size (0: not checked)
}

const maxIDLen = 255

// validID reports whether id can be a message's id: a message_id property
// (at most 255 bytes) and PostgreSQL text (no NUL) take it.
func validID(id string) bool {
	return id != "" && len(id) <= maxIDLen && utf8.ValidString(id) && !strings.ContainsFunc(id, unicode.IsControl)
}

// fromRetryQueue reports whether the broker brought the delivery back from
// one of our delay queues (x-death names the queue): only then was its
// x-attempt header written by this runtime.
func (dr *door) fromRetryQueue(d amqp.Delivery) bool {
	deaths, _ := d.Headers["x-death"].([]any)
	prefix := dr.cfg.Topology.Queue + ".retry."
	for _, x := range deaths {
		if t, ok := x.(amqp.Table); ok {
			if q, _ := t["queue"].(string); strings.HasPrefix(q, prefix) {
				return true
			}
		}
	}
	return false
}

// received is the handler's view of a delivery as the runtime trusts it:
// only its own retry path raises the attempt and hold counts, so a
// producer's x-attempt and x-pause-holds are not trusted unless the delivery
// came from one of its delay queues.
func (dr *door) received(d amqp.Delivery) Message {
	msg := message(d)
	if !dr.fromRetryQueue(d) {
		msg.Attempt, msg.holds = 1, 0
	}
	return msg
}

// message builds the handler's view of a delivery.
func message(d amqp.Delivery) Message {
	attempt := 1
	if n, ok := intHeader(d.Headers, wire.HeaderAttempt); ok && n > 1 {
		attempt = n
	}
	holds, _ := intHeader(d.Headers, wire.HeaderPauseHolds)
	exchange, key, _ := rabbit.Origin(d)
	return Message{
		ID:          d.MessageId,
		Body:        d.Body,
		ContentType: d.ContentType,
		Exchange:    exchange,
		RoutingKey:  key,
		Headers:     d.Headers,
		Attempt:     attempt,
		Redelivered: d.Redelivered,
		PublishedAt: publishedAt(d),
		seenAt:      time.Now(),
		holds:       max(holds, 0),
	}
}

func publishedAt(d amqp.Delivery) time.Time {
	if ms, ok := int64Header(d.Headers, wire.HeaderTimestampMillis); ok && ms > 0 {
		return time.UnixMilli(ms)
	}
	return d.Timestamp
}

// admit applies the checks every handler needs before a body is trusted,
// decodes it with the Decoder (a refusal is left in msg.undecoded: the inline
// mode dead-letters it, the buffered mode stores it to be parked; a refused
// body without a message_id property is the reason itself, in either mode)
// and resolves the dedupe key. A non-empty reason dead-letters the delivery,
// under msg.ID wherever one could be read.
// copyHeadroom is room kept in a frame for the headers the runtime adds to a
// copy: its counters and stamps, the errors (1 KiB each at most), the
// original exchange and key, a trace context.
const copyHeadroom = 8 << 10

func (dr *door) admit(d amqp.Delivery, msg *Message) (reason Reason, err error) {
	if len(d.Body) > dr.cfg.MaxBodyBytes {
		return reasonBodyTooLarge, errors.New("body of " + strconv.Itoa(len(d.Body)) + " bytes exceeds " + strconv.Itoa(dr.cfg.MaxBodyBytes))
	}
	if !dr.acceptsContentType(d.ContentType) {
		return reasonUnsupportedContent, errors.New("content type " + strconv.Quote(d.ContentType) + " is not accepted")
	}
	if n, limit := rabbit.HeaderFrameSize(rabbit.Copy(d)), int(dr.frameMax.Load())-copyHeadroom; limit > 0 && n > limit {
		// A retry, a hold or a dead letter adds the runtime's headers to the
		// message's: no copy would fit one frame, and the broker would close
		// the connection on each. Its dead letter leaves the producer's
		// headers out.
		return reasonHeadersTooLarge, errors.New("properties and headers of " + strconv.Itoa(n) +
			" bytes leave no room in one frame for the runtime's (" + strconv.Itoa(limit) + " at most)")
	}
	if dr.cfg.Decoder != nil {
		ev, err := dr.decode(origin{msg.Exchange, msg.RoutingKey}, d.Body, d.MessageId)
		msg.undecoded = err
		msg.Event, msg.orderingKey = ev.event, ev.orderingKey
		switch {
		case msg.ID != "":
		case err != nil:
			// The id was to come from the event: the refusal says why there
			// is none, and ends the message at once in either mode. An id
			// the refused body names all the same (the Decoder read that
			// far) goes on the dead letter and the log line, so that an
			// operator can find it; it is no dedupe key.
			if validID(ev.id) {
				msg.ID = ev.id
			}
			return permanentReason(err), err
		default:
			msg.ID = ev.id
		}
	}
	if msg.ID == "" && dr.cfg.KeyFromBody != nil {
		msg.ID = dr.cfg.KeyFromBody(d.Body)
	}
	switch {
	case msg.ID == "":
		return reasonMissingID, errors.New("no message_id property and no id in the body")
	case !validID(msg.ID):
		msg.ID = d.MessageId // keep the copy publishable: a message_id property is at most 255 bytes
		return reasonInvalidID, errors.New("message id is longer than 255 bytes, not UTF-8, or holds a control character")
	}
	return Reason{}, nil
}

// decode runs the service's Decoder on a body. A refusal comes back as a
// PermanentError with the reason to dead-letter (park) with, and the id the
// refused body names if the Decoder read one; so does a panic of the
// Decoder, counted and logged (ReasonInvalidEvent), without an id, so that a
// body it cannot take never crashes a replica, at ingest or when the
// buffered mode decodes a stored message again.
func (dr *door) decode(o origin, body []byte, id string) (d decoded, err error) {
	defer func() {
		if v := recover(); v != nil {
			dr.metrics.panics.WithLabelValues(dr.cfg.Name).Inc()
			dr.log.Error("the Decoder panicked; the message is refused as an invalid event",
				"message_id", id, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			d, err = decoded{}, Permanent(reasonInvalidEvent, fmt.Errorf("decode: the Decoder panicked: %v", v))
			if we, ok := v.(*wordError); ok {
				d, err = decoded{}, Permanent(reasonInvalidReason, fmt.Errorf("decode: %w", we))
			}
		}
	}()
	d, err = dr.cfg.Decoder.decode(o, body)
	if err != nil {
		return decoded{id: d.id}, refusal(err)
	}
	return d, nil
}

func (dr *door) acceptsContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	for _, ok := range dr.cfg.ContentTypes {
		if mt == ok {
			return true
		}
	}
	return false
}

func (r *Runtime) ack(ctx context.Context, s *session, d amqp.Delivery, msg Message, out Outcome, log *messageLog) {
	r.acked(msg, out, log, r.mover.settle(ctx, s, d.DeliveryTag))
}

// settle acks a delivery, a settle span of the delivery's trace.
func (mv *mover) settle(ctx context.Context, s *session, tag uint64) error {
	_, span := mv.cfg.Tracer.Settle(ctx, "ack", mv.cfg.Topology.Queue, tag)
	err := s.acks.ack(tag)
	span.Fail(err)
	span.End()
	return err
}

// acked ends a message whose effects are committed, once its ack was sent
// (err is the ack's error).
func (r *Runtime) acked(msg Message, out Outcome, log *messageLog, err error) {
	if err != nil {
		// The effects are committed; the redelivery will be suppressed by the inbox.
		log.get().Warn("ack failed after commit; the redelivery will be a duplicate", "outcome", string(out), "err", err)
		return
	}
	r.stage(StageAck)
	r.counted(msg, out, log)
}

// counted counts a settled message and logs it: at debug level when it went
// as it should.
func (r *Runtime) counted(msg Message, out Outcome, log *messageLog) {
	r.metrics.messages.WithLabelValues(r.cfg.Name, string(out)).Inc()
	level := slog.LevelInfo
	if out == OutcomeProcessed || out == OutcomeStored {
		level = slog.LevelDebug
	}
	if r.log.Enabled(context.Background(), level) {
		log.get().Log(context.Background(), level, "message "+string(out), "outcome", string(out), "attempt", msg.Attempt)
	}
}

// messageLog builds a message's logger on first use: most messages are never
// logged about, and the handler's attributes cost a parse of the body.
type messageLog struct {
	door        *door
	msg         *Message // read at first use: admit may resolve the id from the body
	tag         uint64
	redelivered bool
	attrs       []any // more attributes (the buffered mode's ordering key)
	l           *slog.Logger
}

func (m *messageLog) get() *slog.Logger {
	if m.l == nil {
		m.l = m.door.messageLogger(*m.msg, m.tag, m.redelivered).With(m.attrs...)
	}
	return m.l
}

// messageLogger puts the message's id (the resolved dedupe key) and the
// handler's attributes (an order id) on every line about it.
func (dr *door) messageLogger(msg Message, tag uint64, redelivered bool) *slog.Logger {
	log := dr.log.With("message_id", msg.ID, "delivery_tag", tag, "redelivered", redelivered)
	for _, a := range dr.logAttrs(msg.Body) {
		log = log.With(a)
	}
	return log
}

// logAttrs runs the service's LogAttrs, which must not fail: a panic in it
// costs the attributes and a log line, never the message (it may be settled
// already when a line about it is logged).
func (dr *door) logAttrs(body []byte) (attrs []slog.Attr) {
	if dr.cfg.LogAttrs == nil || len(body) > dr.cfg.MaxBodyBytes {
		return nil
	}
	defer func() {
		if v := recover(); v != nil {
			dr.metrics.panics.WithLabelValues(dr.cfg.Name).Inc()
			dr.log.Error("LogAttrs panicked; logging the message without its attributes", "panic", fmt.Sprint(v))
			attrs = nil
		}
	}()
	return dr.cfg.LogAttrs(body)
}

func intHeader(h amqp.Table, key string) (int, bool) {
	n, ok := int64Header(h, key)
	return int(n), ok
}

func int64Header(h amqp.Table, key string) (int64, bool) {
	switch v := h[key].(type) {
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case int:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	}
	return 0, false
}
