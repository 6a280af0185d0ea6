package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers of ours. The attempt count travels in our own header because x-death
// counting changed in RabbitMQ 3.13 and the quorum delivery limit in 4.3.
const (
	HeaderAttempt          = "x-attempt"
	HeaderDeadLetterReason = "x-dead-letter-reason"
	HeaderDeadLetterError  = "x-dead-letter-error"
	HeaderDeadLetteredAt   = "x-dead-lettered-at"
	HeaderDeadLetterBy     = "x-dead-letter-consumer"
	HeaderFirstError       = "x-first-error"
	HeaderLastError        = "x-last-error"
	HeaderOriginalExchange = "x-original-exchange"
	HeaderOriginalKey      = "x-original-routing-key"
	HeaderHeld             = "x-held" // times put back without spending an attempt
	// HeaderMayHaveRun marks every copy the kit makes of a message that may
	// have run (see Message.MayHaveRun): a copy has neither the broker's
	// redelivered flag nor, once replayed, our attempt count, and without the
	// mark the key-expiry guard would take it for a first attempt.
	HeaderMayHaveRun = "x-may-have-run"
)

const maxIDLen = 255

// deliver runs one delivery to its end: it is acked, sent to a retry queue or
// the dead-letter exchange (then acked), or requeued; or, if its channel died
// meanwhile, left for the broker to redeliver.
func (m *inlineMode) deliver(ctx context.Context, s *session, d amqp.Delivery) {
	r := m.r
	msg := message(d)
	if !r.fromRetryQueue(d) {
		msg.Attempt = 1 // only our retry path raises the count: a producer's x-attempt is not trusted
	}
	reason, admitErr := r.admit(d, &msg)
	if reason == "" && msg.undecoded != nil {
		reason, admitErr = permanentReason(msg.undecoded), msg.undecoded
	}
	log := &messageLog{r: r, msg: &msg, tag: d.DeliveryTag, redelivered: d.Redelivered}
	if reason != "" {
		r.deadLetter(ctx, s, d, msg, reason, admitErr, log)
		return
	}
	out, err := m.apply(ctx, &msg)
	if err == nil {
		r.stage(StageCommit)
		r.ack(d, msg, out, log)
		return
	}
	v := decide(r.failure(ctx, err, msg.ID, msg.Attempt, r.cfg.MaxAttempts))
	switch v.act {
	case actAbandon:
		// Shutdown timeout: the transaction rolled back; leave the delivery
		// unacked so the broker redelivers it.
		log.get().Warn("abandoned at shutdown; will be redelivered", "err", err)
	case actDeadLetter:
		r.deadLetter(ctx, s, d, msg, v.reason, err, log)
	case actPutBack:
		log.get().Warn("waited too long on a lock or a conflict: putting it back without spending an attempt",
			"attempt", msg.Attempt, "err", err)
		r.hold(ctx, s, d, msg, err, log)
	case actPause:
		log.get().Warn("not the message's fault: putting it back without spending an attempt and pausing",
			"cause", v.cause, "messages_failing_in_a_row", r.failures.len(), "attempt", msg.Attempt, "err", err)
		r.hold(ctx, s, d, msg, err, log)
		s.requestPause(v.cause)
	case actRetry:
		r.retry(ctx, s, d, msg, err, log)
	}
}

// failure describes a failed run to decide, asking the database and
// counting the run of failures only when decide needs them.
func (r *Runtime) failure(ctx context.Context, err error, id string, attempt, maxAttempts int) failure {
	return failure{
		err: err, stopping: ctx.Err() != nil, attempt: attempt, maxAttempts: maxAttempts,
		cause:  func() Cause { return r.infrastructure(ctx, err) },
		inARow: func() bool { return r.failingInARow(id, err) },
	}
}

// infrastructure names the fault of a failure that is not the message's: a
// dependency the handler found misconfigured, an SQLSTATE of the database's
// own trouble, a database step that got no answer, or a database that fails
// its check after an unknown error of a database step or a connection fault
// of the handler's. "" means the message failed.
//
// The handler's connection faults and database errors need the check: its
// own reads (the payment handler looks for a recorded payment) fail like the
// runtime's when PostgreSQL goes away, and its outside calls fail with the
// same network errors; and some SQLSTATEs that are the database's when the
// runtime meets them may be the handler's own doing (handlerMayCause). Only
// the database's answer tells them apart: without it, a handler writing
// through its read-only Reader was put back without an attempt, the check
// passed, and it failed again, a pause loop.
func (r *Runtime) infrastructure(ctx context.Context, err error) Cause {
	var se *stepError
	fromHandler := errors.As(err, &se) && se.step == stepHandler
	cause := pauseCause(err)
	switch {
	case cause != "" && !(fromHandler && handlerMayCause(err)):
		return cause
	case se == nil, fromHandler && cause == "" && !connectionFault(err):
		return "" // the message failed
	}
	if r.pingDatabase(ctx) != nil {
		return CauseDatabase
	}
	return ""
}

// handlerMayCause reports an SQLSTATE that is the database's trouble when the
// runtime's own statements meet it, but that a handler's own statement can
// cause by itself: a write through its read-only Reader (25006: a standby's
// answer), a table or column of its own it lacks or may not read. A
// handler's reads never write, so a standby cannot be the cause there.
func handlerMayCause(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && handlerMayCauseState(pg.Code)
}

// pingDatabase tells a database outage from a failure of the message. Error
// classes alone cannot: a handler's HTTP call fails with the same network
// errors, and a pool can still answer while new connections are refused.
func (r *Runtime) pingDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return r.cfg.DatabaseCheck(ctx)
}

// failingInARow counts a retried failure of the handler's outside-call step
// and reports whether PauseAfterFailures distinct messages have now failed in
// a row: a dependency down for every message, not this message's fault.
func (r *Runtime) failingInARow(id string, err error) bool {
	var se *stepError
	if r.cfg.PauseAfterFailures < 0 || !errors.As(err, &se) || se.step != stepHandler {
		return false
	}
	return r.failures.fail(id, r.cfg.PauseAfterFailures) >= r.cfg.PauseAfterFailures
}

// keyExpired refuses a message that may have called out before (a retry, a
// redelivery, one put back, or a copy marked HeaderMayHaveRun) and is older
// than the key lifetime. It runs after the inbox look-up, so a message
// applied already is a duplicate, not refused.
func (r *Runtime) keyExpired(msg Message) error {
	if age, expired := keyExpired(r.cfg.KeyTTL, msg.PublishedAt, msg.MayHaveRun()); expired {
		return keyExpiredError("published", age, r.cfg.KeyTTL)
	}
	return nil
}

// keyExpired is the key-expiry guard of both modes: a message that may have
// called out before and is older than ttl, the key lifetime of the services
// the handler calls, must not call again (with a key that may be forgotten,
// the call could do twice what the first did). Its age counts from since; a
// zero since, or a zero ttl, turns the guard off.
func keyExpired(ttl time.Duration, since time.Time, mayHaveRun bool) (age time.Duration, expired bool) {
	if ttl <= 0 || since.IsZero() || !mayHaveRun {
		return 0, false
	}
	age = time.Since(since)
	return age, age > ttl
}

// keyExpiredError is the permanent error of a message the guard refused;
// what says what its age counts from.
func keyExpiredError(what string, age, ttl time.Duration) error {
	return Permanent(ReasonKeyExpired, fmt.Errorf("%s %s ago, and it may have called out before: "+
		"its idempotency key may be forgotten (the key lifetime is %s)", what, age.Round(time.Second), ttl))
}

// fromRetryQueue reports whether the broker brought the delivery back from
// one of our delay queues (x-death names the queue): only then was its
// x-attempt header written by this runtime.
func (r *Runtime) fromRetryQueue(d amqp.Delivery) bool {
	deaths, _ := d.Headers["x-death"].([]any)
	prefix := r.cfg.Topology.Queue + ".retry."
	for _, x := range deaths {
		if t, ok := x.(amqp.Table); ok {
			if q, _ := t["queue"].(string); strings.HasPrefix(q, prefix) {
				return true
			}
		}
	}
	return false
}

// message builds the handler's view of a delivery.
func message(d amqp.Delivery) Message {
	attempt := 1
	if n, ok := intHeader(d.Headers, HeaderAttempt); ok && n > 1 {
		attempt = n
	}
	return Message{
		ID:          d.MessageId,
		Body:        d.Body,
		ContentType: d.ContentType,
		Headers:     d.Headers,
		Attempt:     attempt,
		Redelivered: d.Redelivered,
		PublishedAt: publishedAt(d),
		seenAt:      time.Now(),
	}
}

// HeaderTimestampMillis is the publish time in milliseconds since the epoch,
// the header RabbitMQ's message timestamp plugin sets; the AMQP timestamp
// property has whole seconds only.
const HeaderTimestampMillis = "timestamp_in_ms"

func publishedAt(d amqp.Delivery) time.Time {
	if ms, ok := int64Header(d.Headers, HeaderTimestampMillis); ok && ms > 0 {
		return time.UnixMilli(ms)
	}
	return d.Timestamp
}

// admit applies the checks every handler needs before a body is trusted,
// decodes it with the Decoder (a refusal is left in msg.undecoded: the inline
// mode dead-letters it, the buffered mode stores it to be parked) and
// resolves the dedupe key. A non-empty reason dead-letters the delivery.
func (r *Runtime) admit(d amqp.Delivery, msg *Message) (reason Reason, err error) {
	if len(d.Body) > r.cfg.MaxBodyBytes {
		return ReasonBodyTooLarge, errors.New("body of " + strconv.Itoa(len(d.Body)) + " bytes exceeds " + strconv.Itoa(r.cfg.MaxBodyBytes))
	}
	if !r.acceptsContentType(d.ContentType) {
		return ReasonUnsupportedContent, errors.New("content type " + strconv.Quote(d.ContentType) + " is not accepted")
	}
	if r.cfg.Decoder != nil {
		ev, err := r.cfg.Decoder.decode(d.Body)
		if err != nil {
			msg.undecoded = Permanent(decodeReason(err), fmt.Errorf("decode: %w", err))
		}
		msg.Event, msg.orderingKey = ev.event, ev.orderingKey
		if msg.ID == "" {
			msg.ID = ev.id
		}
	}
	if msg.ID == "" && r.cfg.KeyFromBody != nil {
		msg.ID = r.cfg.KeyFromBody(d.Body)
	}
	switch {
	case msg.ID == "":
		return ReasonMissingID, errors.New("no message_id property and no id in the body")
	case len(msg.ID) > maxIDLen || !utf8.ValidString(msg.ID) || strings.ContainsFunc(msg.ID, unicode.IsControl):
		msg.ID = d.MessageId // keep the copy publishable: a message_id property is at most 255 bytes
		return ReasonInvalidID, errors.New("message id is longer than 255 bytes, not UTF-8, or holds a control character")
	}
	return "", nil
}

func (r *Runtime) acceptsContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	for _, ok := range r.cfg.ContentTypes {
		if mt == ok {
			return true
		}
	}
	return false
}

// apply looks the message up in the inbox (after any worker of this replica
// holding the same id is done), runs the handler with no transaction open,
// then hands its writes to the committers and waits for their commit.
func (m *inlineMode) apply(ctx context.Context, msg *Message) (Outcome, error) {
	r := m.r
	ctx, cancel := context.WithTimeout(ctx, r.applyTimeout)
	defer cancel()
	release, err := r.inFlight.acquire(ctx, msg.ID)
	if err != nil {
		return "", err
	}
	defer release()
	seen, err := m.lookups.seen(ctx, msg.ID, msg.Body)
	switch {
	case err != nil:
		return "", failedAt(stepLookup, err)
	case seen:
		return OutcomeDuplicate, nil
	}
	if err := r.keyExpired(*msg); err != nil {
		return "", err
	}
	msg.ran = true
	writes, err := r.handler.Handle(ctx, *msg)
	if err != nil {
		return "", failedAt(stepHandler, err)
	}
	r.failures.succeeded() // the outside calls work
	out, fresh, err := m.commits.commit(ctx, *msg, writes)
	switch {
	case err != nil:
		return "", failedAt(stepCommit, err)
	case !fresh:
		return OutcomeDuplicate, nil
	case out == "":
		out = OutcomeProcessed
	}
	if !msg.PublishedAt.IsZero() {
		r.metrics.endToEnd.WithLabelValues(r.cfg.Name).Observe(time.Since(msg.PublishedAt).Seconds())
	}
	return out, nil
}

func (r *Runtime) ack(d amqp.Delivery, msg Message, out Outcome, log *messageLog) {
	if err := d.Ack(false); err != nil {
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
	r           *Runtime
	msg         *Message // read at first use: admit may resolve the id from the body
	tag         uint64
	redelivered bool
	attrs       []any // more attributes (the buffered mode's ordering key)
	l           *slog.Logger
}

func (m *messageLog) get() *slog.Logger {
	if m.l == nil {
		m.l = m.r.messageLogger(*m.msg, m.tag, m.redelivered).With(m.attrs...)
	}
	return m.l
}

// messageLogger puts the message's id (the resolved dedupe key) and the
// handler's attributes (an order id) on every line about it.
func (r *Runtime) messageLogger(msg Message, tag uint64, redelivered bool) *slog.Logger {
	log := r.log.With("message_id", msg.ID, "delivery_tag", tag, "redelivered", redelivered)
	for _, a := range r.logAttrs(msg.Body) {
		log = log.With(a)
	}
	return log
}

// logAttrs runs the service's LogAttrs, which must not fail: a panic in it
// costs the attributes and a log line, never the message (it may be settled
// already when a line about it is logged).
func (r *Runtime) logAttrs(body []byte) (attrs []slog.Attr) {
	if r.cfg.LogAttrs == nil || len(body) > r.cfg.MaxBodyBytes {
		return nil
	}
	defer func() {
		if v := recover(); v != nil {
			r.metrics.panics.WithLabelValues(r.cfg.Name).Inc()
			r.log.Error("LogAttrs panicked; logging the message without its attributes", "panic", fmt.Sprint(v))
			attrs = nil
		}
	}()
	return r.cfg.LogAttrs(body)
}

// permanentReason is the reason a permanent failure dead-letters (parks)
// with: checked here too, since a PermanentError may be built without
// Permanent.
func permanentReason(err error) Reason {
	var pe *PermanentError
	switch {
	case !errors.As(err, &pe) || pe.Reason == "":
		return ReasonPermanent
	case !pe.Reason.Valid():
		return ReasonInvalidReason
	}
	return pe.Reason
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
