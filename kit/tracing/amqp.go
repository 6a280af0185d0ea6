package tracing

import (
	"context"
	"math"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Attributes of the messaging semantic conventions (RabbitMQ), and the kit's
// own under inbox.*.
const (
	attrSystem      = attribute.Key("messaging.system")
	attrOpType      = attribute.Key("messaging.operation.type")
	attrOpName      = attribute.Key("messaging.operation.name")
	attrDestination = attribute.Key("messaging.destination.name")
	attrRoutingKey  = attribute.Key("messaging.rabbitmq.destination.routing_key")
	attrMessageID   = attribute.Key("messaging.message.id")
	attrBodySize    = attribute.Key("messaging.message.body.size")
	attrDeliveryTag = attribute.Key("messaging.rabbitmq.message.delivery_tag")
	attrConsumer    = attribute.Key("inbox.consumer") // the inbox's consumer column (RabbitMQ has no consumer group)
	attrErrorType   = attribute.Key("error.type")
	// AttrOutcome is what the inbox made of a delivery: processed,
	// duplicate, retried, dead_lettered, requeued, abandoned, stored.
	AttrOutcome = attribute.Key("inbox.outcome")
	// AttrAttempt is the handler run of the delivery, the first is 1.
	AttrAttempt = attribute.Key("inbox.attempt")
	// AttrRedelivered is the broker's redelivered flag.
	AttrRedelivered = attribute.Key("inbox.redelivered")
)

// destination is the semantic conventions' RabbitMQ destination name:
// exchange:routing_key (and :queue on the consumer side), the empty parts
// left out.
func destination(parts ...string) string {
	out := ""
	for _, p := range parts {
		if p == "" {
			continue
		}
		if out != "" {
			out += ":"
		}
		out += p
	}
	return out
}

// headers is an AMQP header table as a propagation carrier.
type headers amqp.Table

func (h headers) Get(key string) string {
	switch v := h[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

func (h headers) Set(key, value string) { h[key] = value }

func (h headers) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Publish starts the producer span of a publish of msg to exchange with key,
// and writes its context into msg's headers (traceparent, tracestate), a new
// table if msg has none. Its parent is ctx's span, else the trace context
// msg's headers carry already (a copy of a delivery made outside its
// processing: one put back at a stop, a dead letter refused at ingest), so
// that a copy never leaves its message's trace. End it once the broker
// confirmed, Fail it if not. The span is named for the exchange (the
// routing key for the default exchange: a queue): routing keys a handler
// picks may be many.
func (t *Tracer) Publish(ctx context.Context, exchange, key string, msg *amqp.Publishing) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = t.prop.Extract(ctx, headers(msg.Headers))
	}
	name := exchange
	if name == "" {
		name = key
	}
	ctx, s := t.t.Start(ctx, "publish "+name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attrSystem.String("rabbitmq"), attrOpType.String("send"), attrOpName.String("publish"),
			attrDestination.String(destination(exchange, key)), attrRoutingKey.String(key),
			attrMessageID.String(msg.MessageId), attrBodySize.Int(len(msg.Body)),
		))
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	t.prop.Inject(ctx, headers(msg.Headers))
	return ctx, Span{s}
}

// Process starts the consumer span of a delivery's processing from queue by
// consumer, the child of the trace context its headers carry (its producer's
// publish span, or that of the retry or dead-letter copy it is), else the
// root of a new trace.
func (t *Tracer) Process(ctx context.Context, d amqp.Delivery, queue, consumer string) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx = t.prop.Extract(ctx, headers(d.Headers))
	ctx, s := t.t.Start(ctx, "process "+queue, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attrSystem.String("rabbitmq"), attrOpType.String("process"), attrOpName.String("process"),
			attrDestination.String(destination(d.Exchange, d.RoutingKey, queue)), attrRoutingKey.String(d.RoutingKey),
			attrMessageID.String(d.MessageId), attrBodySize.Int(len(d.Body)), attrConsumer.String(consumer),
			attrDeliveryTag.Int64(deliveryTag(d.DeliveryTag)), AttrRedelivered.Bool(d.Redelivered),
		))
	return ctx, Span{s}
}

// deliveryTag is a delivery tag as the attribute's int64: a channel numbers
// its deliveries from 1, so none comes near 2^63.
func deliveryTag(tag uint64) int64 {
	return int64(min(tag, math.MaxInt64)) // #nosec G115 -- capped on this line
}

// Settle starts the span of a settlement (ack, nack, reject) of a delivery
// from queue whose processing ctx holds.
func (t *Tracer) Settle(ctx context.Context, op, queue string, tag uint64) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx, s := t.t.Start(ctx, op+" "+queue, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrDestination.String(queue),
		attrSystem.String("rabbitmq"), attrOpType.String("settle"), attrOpName.String(op), attrDeliveryTag.Int64(deliveryTag(tag)),
	))
	return ctx, Span{s}
}

// Inject writes ctx's trace context into h (a nil h gets a new table) and
// returns it: for a message stored before it is published (the outbox), so
// that its publish continues the trace of the transaction that wrote it.
func (t *Tracer) Inject(ctx context.Context, h map[string]any) map[string]any {
	if t == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	if h == nil {
		h = map[string]any{}
	}
	t.prop.Inject(ctx, headers(h))
	return h
}

// Extract returns ctx with the trace context of headers h.
func (t *Tracer) Extract(ctx context.Context, h map[string]any) context.Context {
	if t == nil {
		return ctx
	}
	return t.prop.Extract(ctx, headers(h))
}

// Outcome records what the inbox made of the delivery on its process span.
func (s Span) Outcome(outcome string, attempt int) {
	if s.s == nil {
		return
	}
	s.s.SetAttributes(AttrOutcome.String(outcome), AttrAttempt.Int(attempt))
}

// Moved corrects the outcome of a delivery whose move (a retry, dead-letter
// or put-back copy) did not happen: it is left for the broker (outcome),
// failed with err.
func (s Span) Moved(outcome string, err error) {
	if s.s == nil {
		return
	}
	s.s.SetAttributes(AttrOutcome.String(outcome))
	s.FailAs(err, "move_failed")
}

// FailAs marks the span failed with err, of the class errorType (the
// dead-letter reason, a step).
func (s Span) FailAs(err error, errorType string) {
	if s.s == nil {
		return
	}
	s.Fail(err)
	s.s.SetAttributes(attrErrorType.String(errorType))
}

// Commit starts the span of the transaction that commits the delivery whose
// process span is parent, with batch messages in it (a group commit).
func (t *Tracer) Commit(parent Span, batch int) Span {
	if t == nil || parent.s == nil {
		return Span{}
	}
	_, s := t.t.Start(trace.ContextWithSpan(context.Background(), parent.s), "commit", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Key("db.system.name").String("postgresql"), attribute.Key("inbox.batch.size").Int(batch)))
	return Span{s}
}

// SettleOf starts a settle span under parent, for a settlement made away
// from the delivery's context (a committer's multiple ack).
func (t *Tracer) SettleOf(parent Span, op, queue string, tag uint64) Span {
	if t == nil || parent.s == nil {
		return Span{}
	}
	_, s := t.Settle(trace.ContextWithSpan(context.Background(), parent.s), op, queue, tag)
	return s
}

// ContextWith returns ctx carrying s as its span; ctx itself for the zero Span.
func ContextWith(ctx context.Context, s Span) context.Context {
	if s.s == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, s.s)
}

// ProcessStored starts the consumer span of a stored message's processing
// (the buffered inbox): the child of the trace context its stored headers
// carry, else the root of a new trace.
func (t *Tracer) ProcessStored(ctx context.Context, h map[string]any, messageID, queue, consumer string, bodySize int) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx = t.prop.Extract(ctx, headers(h))
	ctx, s := t.t.Start(ctx, "process "+queue, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attrSystem.String("rabbitmq"), attrOpType.String("process"), attrOpName.String("process"),
			attrDestination.String(queue), attrMessageID.String(messageID), attrBodySize.Int(bodySize),
			attrConsumer.String(consumer), attribute.Key("inbox.mode").String("buffered"),
		))
	return ctx, Span{s}
}

// FromContext returns ctx's span, the zero Span if it has none.
func FromContext(ctx context.Context) Span {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return Span{}
	}
	return Span{trace.SpanFromContext(ctx)}
}
