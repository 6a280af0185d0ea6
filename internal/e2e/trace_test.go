package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inbox-template/payment-service/examples/shipping"
	"github.com/inbox-template/payment-service/internal/demo/fakecarrier"
	"github.com/inbox-template/payment-service/internal/demo/fakegateway"
	"github.com/inbox-template/payment-service/internal/demo/producer"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// traceStack is the publisher, the payment service and the shipping service
// of one vhost, in this process, each with its own tracer provider (its own
// service.name) and one span recorder for all.
type traceStack struct {
	t         *testing.T
	rec       *tracetest.SpanRecorder
	vhost     string
	pay, ship *kittest.Stack
	failNext  atomic.Int32    // gateway requests to answer 503 before the gateway sees them
	tracer    *tracing.Tracer // the publisher's
}

// startTraceStack starts the stack, both services with env (NAME=value) added.
func startTraceStack(t *testing.T, env ...string) *traceStack {
	t.Helper()
	s := &traceStack{t: t, rec: tracetest.NewSpanRecorder(), vhost: kittest.VHost(t)}
	log := kittest.Logger(t)
	gwDB, _ := kittest.MigratedDB(t, fakegateway.Migrations)
	gw, err := fakegateway.NewServer(gwDB, prometheus.NewRegistry(), log, fakegateway.Faults{}, fakegateway.Options{InFlightTakeover: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.failNext.Add(-1) >= 0 {
			http.Error(w, "unavailable (test)", http.StatusServiceUnavailable)
			return
		}
		gw.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(gwSrv.Close)
	carrierDB, _ := kittest.MigratedDB(t, fakecarrier.Migrations)
	sqlDB, err := carrierDB.DB()
	if err != nil {
		t.Fatal(err)
	}
	carrier, err := fakecarrier.NewServer(sqlDB, fakecarrier.Faults{}, time.Minute, log)
	if err != nil {
		t.Fatal(err)
	}
	carrierSrv := httptest.NewServer(carrier.Handler())
	t.Cleanup(carrierSrv.Close)

	// Shipping first: its queue must be bound before the payments' outbox
	// publishes OrderPaid (mandatory).
	ship := shipping.Service()
	ship.TraceProcessor = s.rec
	// The carrier answers at once (no latency): nothing stays in flight
	// there, so its window may be as short as the retries here.
	s.ship = kittest.Start(t, ship, append([]string{"AMQP_URL=" + s.vhost, "CARRIER_URL=" + carrierSrv.URL,
		"CARRIER_IN_FLIGHT_TIMEOUT=1ms"}, env...)...)
	pay := payment.Service()
	pay.TraceProcessor = s.rec
	s.pay = kittest.Start(t, pay, append([]string{"AMQP_URL=" + s.vhost, "GATEWAY_URL=" + gwSrv.URL,
		"RETRY_DELAYS=100ms,200ms", "GATEWAY_IN_FLIGHT_TIMEOUT=1ms", "OUTBOX_POLL_INTERVAL=200ms"}, env...)...)

	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "order-publisher"))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s.tracer = tracing.New(tp)
	return s
}

// publishOrders runs the order publisher for n orders under run id.
func (s *traceStack) publishOrders(run string, n int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := producer.Run(ctx, producer.Config{
		Broker: producer.Broker{URL: s.vhost, Exchange: "orders", RoutingKey: "order.placed", Name: "trace test"},
		Load:   producer.Load{RunID: run, Count: n, Seed: 1},
		Tracer: s.tracer,
	}, kittest.Logger(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
}

// publish sends one message to the orders exchange through a traced
// publisher, as a producer other than order-publisher would.
func (s *traceStack) publish(msg amqp.Publishing) {
	s.t.Helper()
	conn, err := amqp.Dial(s.vhost)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	pub, err := rabbit.NewPublisher(conn)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pub.Traced(s.tracer).Publish(ctx, "orders", "order.placed", msg); err != nil {
		s.t.Fatal(err)
	}
}

// spans are the ended spans recorded so far.
type spans []sdktrace.ReadOnlySpan

func (s *traceStack) spans() spans { return s.rec.Ended() }

// waitSpan waits for an ended span that match accepts, and returns it.
func (s *traceStack) waitSpan(what string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	s.t.Helper()
	var found sdktrace.ReadOnlySpan
	kittest.Eventually(s.t, 30*time.Second, what, func() (bool, error) {
		for _, sp := range s.spans() {
			if match(sp) {
				found = sp
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

func attr(sp sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range sp.Attributes() {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

func service(sp sdktrace.ReadOnlySpan) string {
	v, _ := sp.Resource().Set().Value("service.name")
	return v.AsString()
}

// named matches a span of service by name, and of the message id if given.
func named(svc, name, messageID string) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool {
		return service(sp) == svc && sp.Name() == name &&
			(messageID == "" || attr(sp, "messaging.message.id") == messageID)
	}
}

// childOf matches a span of service by name whose parent is parent.
func childOf(svc, name string, parent sdktrace.ReadOnlySpan) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool {
		return service(sp) == svc && sp.Name() == name && sp.Parent().SpanID() == parent.SpanContext().SpanID()
	}
}

func describe(sp sdktrace.ReadOnlySpan) string {
	return fmt.Sprintf("%s %q (%s, trace %s, parent %s)", service(sp), sp.Name(), sp.SpanKind(), sp.SpanContext().TraceID(), sp.Parent().SpanID())
}

// TestOneOrderIsOneTrace follows one order from order-publisher through the
// payment service, its outbox relay and the shipping service: one trace,
// each span the child of the one before, with the messaging attributes.
func TestOneOrderIsOneTrace(t *testing.T) {
	s := startTraceStack(t)
	s.publishOrders("trace", 1)
	s.ship.WaitOutcome(kit.OutcomeProcessed, 1)

	published := s.waitSpan("the order's publish", named("order-publisher", "publish orders", ""))
	process := s.waitSpan("payment's process span", childOf("payment-service", "process payments.order-placed", published))
	charge := s.waitSpan("the gateway call", childOf("payment-service", "gateway charge", process))
	commit := s.waitSpan("payment's commit", childOf("payment-service", "commit", process))
	s.waitSpan("payment's ack", childOf("payment-service", "ack payments.order-placed", process))
	relayed := s.waitSpan("the relay's publish of OrderPaid", childOf("payment-service", "publish payments", commit))
	shipped := s.waitSpan("shipping's process span", childOf("shipping-service", "process shipping-service.order-paid", relayed))
	s.waitSpan("the carrier call", childOf("shipping-service", "carrier book", shipped))
	s.waitSpan("shipping's commit", childOf("shipping-service", "commit", shipped))
	s.waitSpan("shipping's ack", childOf("shipping-service", "ack shipping-service.order-paid", shipped))

	id := published.SpanContext().TraceID()
	for _, sp := range []sdktrace.ReadOnlySpan{process, charge, commit, relayed, shipped} {
		if sp.SpanContext().TraceID() != id {
			t.Errorf("%s is not in the order's trace %s", describe(sp), id)
		}
	}
	if published.Parent().IsValid() {
		t.Errorf("the publisher's span has a parent: %s", describe(published))
	}
	for _, c := range []struct {
		span sdktrace.ReadOnlySpan
		kind trace.SpanKind
		want map[attribute.Key]string
	}{
		{published, trace.SpanKindProducer, map[attribute.Key]string{
			"messaging.system": "rabbitmq", "messaging.operation.type": "send", "messaging.destination.name": "orders:order.placed",
			"messaging.rabbitmq.destination.routing_key": "order.placed",
		}},
		{process, trace.SpanKindConsumer, map[attribute.Key]string{
			"messaging.system": "rabbitmq", "messaging.operation.type": "process", "inbox.outcome": "processed", "inbox.attempt": "1",
			"messaging.destination.name": "orders:order.placed:payments.order-placed", "messaging.message.id": attr(published, "messaging.message.id"),
			"inbox.consumer": "payment-service",
		}},
		{relayed, trace.SpanKindProducer, map[attribute.Key]string{
			"messaging.destination.name": "payments:order.paid", "messaging.rabbitmq.destination.routing_key": "order.paid",
		}},
		{shipped, trace.SpanKindConsumer, map[attribute.Key]string{
			"inbox.outcome": "processed", "messaging.message.id": attr(relayed, "messaging.message.id"),
		}},
	} {
		if c.span.SpanKind() != c.kind {
			t.Errorf("%s: kind %s, want %s", describe(c.span), c.span.SpanKind(), c.kind)
		}
		for k, want := range c.want {
			if got := attr(c.span, k); got != want {
				t.Errorf("%s: %s = %q, want %q", describe(c.span), k, got, want)
			}
		}
	}
	if attr(relayed, "messaging.message.id") == "" {
		t.Errorf("the relay's publish has no message id: %s", describe(relayed))
	}
}

// TestDuplicateRetryAndDeadLetterAreVisibleInTheTrace: a duplicate is a
// process span of its own with outcome duplicate; a retry stays in the trace,
// a new process span under the retry's publish; a dead letter's process span
// is failed with its reason, and its copy to the dead-letter exchange is a
// publish span under it.
func TestDuplicateRetryAndDeadLetterAreVisibleInTheTrace(t *testing.T) {
	s := startTraceStack(t)
	body, err := json.Marshal(orders.OrderPlaced{EventID: "evt-dup", OrderID: "o-dup", CustomerID: "cus-1", AmountCents: 1200,
		Currency: "EUR", PlacedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	msg := amqp.Publishing{MessageId: "m-dup", ContentType: "application/json", Body: body, Timestamp: time.Now()}
	s.publish(msg)
	s.pay.WaitOutcome(kit.OutcomeProcessed, 1)
	s.publish(msg)
	s.pay.WaitOutcome(kit.OutcomeDuplicate, 1)
	var duplicates int
	kittest.Eventually(t, 30*time.Second, "two process spans of m-dup", func() (bool, error) {
		duplicates = 0
		n := 0
		for _, sp := range s.spans() {
			if named("payment-service", "process payments.order-placed", "m-dup")(sp) {
				n++
				if attr(sp, "inbox.outcome") == "duplicate" {
					duplicates++
				}
			}
		}
		return n == 2, nil
	})
	if duplicates != 1 {
		t.Errorf("process spans of m-dup with outcome duplicate: %d, want 1", duplicates)
	}

	// A retry: the gateway answers the first attempt 503.
	s.failNext.Store(1)
	body, err = json.Marshal(orders.OrderPlaced{EventID: "evt-retry", OrderID: "o-retry", CustomerID: "cus-1", AmountCents: 900,
		Currency: "EUR", PlacedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	s.publish(amqp.Publishing{MessageId: "m-retry", ContentType: "application/json", Body: body, Timestamp: time.Now()})
	first := s.waitSpan("the failed first attempt", func(sp sdktrace.ReadOnlySpan) bool {
		return named("payment-service", "process payments.order-placed", "m-retry")(sp) && attr(sp, "inbox.attempt") == "1"
	})
	if got := attr(first, "inbox.outcome"); got != "retried" || first.Status().Code != codes.Error {
		t.Errorf("first attempt: outcome %q, status %v; want retried, an error", got, first.Status())
	}
	retryPublish := s.waitSpan("the retry's publish", childOf("payment-service", "publish payments.order-placed.retry.100ms", first))
	second := s.waitSpan("the second attempt", childOf("payment-service", "process payments.order-placed", retryPublish))
	if got := attr(second, "inbox.outcome"); got != "processed" || attr(second, "inbox.attempt") != "2" {
		t.Errorf("second attempt: outcome %q, attempt %s; want processed, 2", got, attr(second, "inbox.attempt"))
	}
	if second.SpanContext().TraceID() != first.SpanContext().TraceID() {
		t.Errorf("the retry left the trace: %s, then %s", describe(first), describe(second))
	}

	// A dead letter: a body that is not an OrderPlaced.
	s.publish(amqp.Publishing{MessageId: "m-poison", ContentType: "application/json", Body: []byte(`{"order_id":`), Timestamp: time.Now()})
	poison := s.waitSpan("the poison message's process span", named("payment-service", "process payments.order-placed", "m-poison"))
	if got := attr(poison, "inbox.outcome"); got != "dead_lettered" || poison.Status().Code != codes.Error || attr(poison, "error.type") == "" {
		t.Errorf("poison: outcome %q, status %v, error.type %q; want dead_lettered, an error, the reason",
			got, poison.Status(), attr(poison, "error.type"))
	}
	dlx := s.waitSpan("the dead letter's publish", func(sp sdktrace.ReadOnlySpan) bool {
		return childOf("payment-service", sp.Name(), poison)(sp) && strings.HasPrefix(sp.Name(), "publish payments.dlx")
	})
	if dlx.SpanKind() != trace.SpanKindProducer {
		t.Errorf("%s: want a producer span", describe(dlx))
	}

	// A replay of the dead letter (dlq replay republishes it with its
	// headers): its processing joins the trace, under the dead letter's
	// publish, confirmed before its span ended.
	var out bytes.Buffer
	if err := kit.Run(context.Background(), payment.Service(), []string{"dlq", "replay", "--id", "m-poison"}, nil, &out); err != nil {
		t.Fatalf("dlq replay: %v\n%s", err, out.String())
	}
	replayed := s.waitSpan("the replay's processing", childOf("payment-service", "process payments.order-placed", dlx))
	if replayed.SpanContext().TraceID() != poison.SpanContext().TraceID() || attr(replayed, "messaging.message.id") != "m-poison" {
		t.Errorf("the replay left the trace: %s, then %s", describe(poison), describe(replayed))
	}
}

// TestOneOrderIsOneTraceBuffered: in the buffered mode the processing of a
// stored message continues the trace its stored headers carry, and the
// outbox row its writes add carries the processing's span on.
func TestOneOrderIsOneTraceBuffered(t *testing.T) {
	s := startTraceStack(t, "INBOX_MODE=buffered")
	s.publishOrders("trace-buffered", 1)
	s.ship.WaitOutcome(kit.OutcomeProcessed, 1)

	published := s.waitSpan("the order's publish", named("order-publisher", "publish orders", ""))
	process := s.waitSpan("payment's processing", childOf("payment-service", "process payments.order-placed", published))
	s.waitSpan("the gateway call", childOf("payment-service", "gateway charge", process))
	relayed := s.waitSpan("the relay's publish of OrderPaid", childOf("payment-service", "publish payments", process))
	shipped := s.waitSpan("shipping's processing", childOf("shipping-service", "process shipping-service.order-paid", relayed))
	for _, sp := range []sdktrace.ReadOnlySpan{process, shipped} {
		if attr(sp, "inbox.outcome") != "processed" || attr(sp, "inbox.mode") != "buffered" {
			t.Errorf("%s: outcome %q, mode %q; want processed, buffered", describe(sp), attr(sp, "inbox.outcome"), attr(sp, "inbox.mode"))
		}
		if sp.SpanContext().TraceID() != published.SpanContext().TraceID() {
			t.Errorf("%s is not in the order's trace", describe(sp))
		}
	}
}
