package tracing

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// delivery runs what the consumer runtime does with its tracer for one
// message: the process span, the outside call, the commit with the writes'
// context, the outbox's injection, the ack, the outcome.
func delivery(t *Tracer, ctx context.Context, d amqp.Delivery, charge func(context.Context, string) (string, error)) {
	ctx, span := t.Process(ctx, d, "payments.order-placed", "payment-service")
	if _, err := charge(ctx, "order-1"); err != nil {
		span.Fail(err)
	}
	commit := t.Commit(span, 1)
	wctx := ContextWith(ctx, commit)
	_ = t.Inject(wctx, nil)
	commit.End()
	_, ack := t.Settle(ctx, "ack", "payments.order-placed", d.DeliveryTag)
	ack.End()
	span.Outcome("processed", 1)
	span.End()
}

func testDelivery() amqp.Delivery {
	return amqp.Delivery{
		MessageId: "m-1", Exchange: "orders", RoutingKey: "order.placed", DeliveryTag: 7, Body: []byte(`{"order_id":"o-1"}`),
		Headers: amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

func charge(context.Context, string) (string, error) { return "ch_1", nil }

// TestTracingOffAllocatesNothing: with tracing off (a nil Tracer) a
// delivery's tracing costs no allocation.
func TestTracingOffAllocatesNothing(t *testing.T) {
	var off *Tracer
	d, ctx := testDelivery(), context.Background()
	call := Call(off, "gateway charge", charge)
	if n := testing.AllocsPerRun(1000, func() { delivery(off, ctx, d, call) }); n != 0 {
		t.Errorf("tracing off: %v allocations per delivery, want 0", n)
	}
	if reflect.ValueOf(call).Pointer() != reflect.ValueOf(charge).Pointer() {
		t.Error("Call with tracing off wrapped the call; want the call itself")
	}
}

// BenchmarkDelivery compares a delivery's tracing off, on and sampled
// (spans recorded, exported nowhere), and on with nothing sampled.
func BenchmarkDelivery(b *testing.B) {
	d, ctx := testDelivery(), context.Background()
	for _, c := range []struct {
		name string
		t    *Tracer
	}{
		{"off", nil},
		{"on-sampled", New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder())))},
		{"on-unsampled", New(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))},
	} {
		b.Run(c.name, func(b *testing.B) {
			call := Call(c.t, "gateway charge", charge)
			b.ReportAllocs()
			for b.Loop() {
				delivery(c.t, ctx, d, call)
			}
		})
	}
}

// TestStartIsOffByDefault: the default configuration starts no exporter.
func TestStartIsOffByDefault(t *testing.T) {
	tr, shutdown, err := Start(context.Background(), Config{TracesExporter: ExporterNone, OTLPProtocol: "http/protobuf", Sampler: "parentbased_always_on"}, Setup{Name: "x"})
	if err != nil || tr != nil {
		t.Fatalf("Start with OTEL_TRACES_EXPORTER=none: tracer %v, err %v; want nil, nil", tr, err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestTraceContextTravelsInHeaders: a publish writes traceparent into the
// headers; a delivery with them continues the trace; a retry copy's
// publish under the process span keeps the trace and becomes the parent.
func TestTraceContextTravelsInHeaders(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	msg := amqp.Publishing{MessageId: "m-1", Body: []byte("{}")}
	_, pub := tr.Publish(context.Background(), "orders", "order.placed", &msg)
	pub.End()
	tp, _ := msg.Headers["traceparent"].(string)
	if !strings.Contains(tp, pub.Context().TraceID().String()) || !strings.Contains(tp, pub.Context().SpanID().String()) {
		t.Fatalf("traceparent %q does not carry the publish span %s", tp, pub.Context().SpanID())
	}
	ctx, proc := tr.Process(context.Background(), amqp.Delivery{Headers: msg.Headers, MessageId: "m-1"}, "q", "c")
	retry := amqp.Publishing{Headers: amqp.Table{"traceparent": tp}} // the copy keeps the original's headers
	_, rp := tr.Publish(ctx, "", "q.retry.1s", &retry)
	rp.End()
	proc.Fail(errors.New("boom"))
	proc.End()
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	p := spans[2]
	if p.Parent().SpanID() != pub.Context().SpanID() || p.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span's parent %s kind %s; want the publish %s, consumer", p.Parent().SpanID(), p.SpanKind(), pub.Context().SpanID())
	}
	if r := spans[1]; r.Parent().SpanID() != p.SpanContext().SpanID() || r.SpanContext().TraceID() != pub.Context().TraceID() {
		t.Errorf("retry publish: parent %s trace %s; want the process span %s in trace %s", r.Parent().SpanID(), r.SpanContext().TraceID(), p.SpanContext().SpanID(), pub.Context().TraceID())
	}
	if got, _ := retry.Headers["traceparent"].(string); !strings.Contains(got, spans[1].SpanContext().SpanID().String()) {
		t.Errorf("the retry copy's traceparent %q is not its publish span's", got)
	}
}

// TestConfigChecksNameTheVariable: each bad OTEL_* value fails naming it.
func TestConfigChecksNameTheVariable(t *testing.T) {
	good := Config{TracesExporter: "otlp", OTLPProtocol: "http/protobuf", Sampler: "parentbased_traceidratio", SamplerArg: "0.25"}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"exporter", func(c *Config) { c.TracesExporter = "jaeger" }, "OTEL_TRACES_EXPORTER"},
		{"endpoint", func(c *Config) { c.OTLPEndpoint = "collector:4318" }, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"traces endpoint", func(c *Config) { c.TracesEndpoint = "ftp://x" }, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{"protocol", func(c *Config) { c.OTLPProtocol = "grpc" }, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"sampler", func(c *Config) { c.Sampler = "sometimes" }, "OTEL_TRACES_SAMPLER"},
		{"ratio", func(c *Config) { c.SamplerArg = "2" }, "OTEL_TRACES_SAMPLER_ARG"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			var failed []string
			Check(cfg, func(ok bool, variable, format string, args ...any) {
				if !ok {
					failed = append(failed, variable)
				}
			})
			if len(failed) != 1 || failed[0] != c.want {
				t.Errorf("failed %v, want [%s]", failed, c.want)
			}
		})
	}
	var failed []string
	Check(good, func(ok bool, variable, _ string, _ ...any) {
		if !ok {
			failed = append(failed, variable)
		}
	})
	if len(failed) != 0 {
		t.Errorf("a good configuration failed %v", failed)
	}
}

// TestCopyOutsideAProcessingStaysInItsTrace: a copy published with no span
// in its context (put back at a stop, dead-lettered at ingest) continues the
// trace its headers carry instead of starting one.
func TestCopyOutsideAProcessingStaysInItsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msg := amqp.Publishing{Headers: amqp.Table{"traceparent": parent}}
	_, s := tr.Publish(context.Background(), "", "payments.order-placed", &msg)
	s.End()
	sp := rec.Ended()[0]
	if sp.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sp.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("copy's publish: trace %s parent %s; want the headers' trace and span", sp.SpanContext().TraceID(), sp.Parent().SpanID())
	}
	if got, _ := msg.Headers["traceparent"].(string); !strings.Contains(got, sp.SpanContext().SpanID().String()) {
		t.Errorf("traceparent %q is not the copy's publish span", got)
	}
	if sp.Name() != "publish payments.order-placed" {
		t.Errorf("span name %q, want the queue of the default exchange", sp.Name())
	}
}

// TestServiceNamePrecedence: OTEL_SERVICE_NAME, then OTEL_RESOURCE_ATTRIBUTES'
// service.name, then the program's name.
func TestServiceNamePrecedence(t *testing.T) {
	for _, c := range []struct {
		name, serviceName, attrs, want string
	}{
		{"program", "", "", "payment-service"},
		{"resource attributes", "", "service.name=from-attrs", "from-attrs"},
		{"service name", "from-var", "service.name=from-attrs", "from-var"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", c.attrs)
			t.Setenv("OTEL_SERVICE_NAME", c.serviceName)
			res, err := programResource(Config{ServiceName: c.serviceName}, "payment-service")
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := res.Set().Value("service.name"); v.AsString() != c.want {
				t.Errorf("service.name %q, want %q", v.AsString(), c.want)
			}
		})
	}
}
