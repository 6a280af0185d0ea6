// Package tracing is the kit's OpenTelemetry tracing: the provider the
// standard OTEL_* variables configure (off unless OTEL_TRACES_EXPORTER says
// otherwise), the W3C trace context carried in AMQP headers, and the spans of
// the messaging semantic conventions for RabbitMQ: a producer span per
// publish, a consumer span per processed delivery, and child spans for what
// happens to it.
//
// Tracing off is a nil *Tracer: every method of a nil Tracer and of the zero
// Span does nothing and allocates nothing, so the hot path pays one nil check.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Config is the tracing part of a program's configuration: the standard
// OpenTelemetry variables this kit reads. The SDK reads the others itself
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_BSP_*).
type Config struct {
	SDKDisabled    bool   `envconfig:"OTEL_SDK_DISABLED" default:"false" desc:"true turns tracing off whatever OTEL_TRACES_EXPORTER says"`
	TracesExporter string `envconfig:"OTEL_TRACES_EXPORTER" default:"none" desc:"none (no tracing, the default), otlp (OTLP over HTTP) or console (spans as JSON on stdout)"`
	OTLPEndpoint   string `envconfig:"OTEL_EXPORTER_OTLP_ENDPOINT" desc:"OTLP/HTTP base URL, /v1/traces is appended (default http://localhost:4318)"`
	TracesEndpoint string `envconfig:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" desc:"OTLP/HTTP URL of the traces, taken as is; wins over OTEL_EXPORTER_OTLP_ENDPOINT"`
	OTLPProtocol   string `envconfig:"OTEL_EXPORTER_OTLP_PROTOCOL" default:"http/protobuf" desc:"http/protobuf or http/json (gRPC is not built in)"`
	ServiceName    string `envconfig:"OTEL_SERVICE_NAME" desc:"service.name of the spans (default the program's name)"`
	Sampler        string `envconfig:"OTEL_TRACES_SAMPLER" default:"parentbased_always_on" desc:"always_on, always_off, traceidratio, or parentbased_ and one of those"`
	SamplerArg     string `envconfig:"OTEL_TRACES_SAMPLER_ARG" desc:"the ratio of the traceidratio samplers, 0 to 1 (default 1)"`
}

// Exporters.
const (
	ExporterNone    = "none"
	ExporterOTLP    = "otlp"
	ExporterConsole = "console"
)

func (c Config) enabled() bool { return !c.SDKDisabled && c.TracesExporter != ExporterNone }

// Check reports each invalid variable of c through require
// (kit.Checks.Require). A program embeds Config in its configuration
// struct: as a named field envconfig would prefix the variables.
func Check(c Config, require func(ok bool, variable, format string, args ...any)) {
	switch c.TracesExporter {
	case ExporterNone, ExporterOTLP, ExporterConsole:
	default:
		require(false, "OTEL_TRACES_EXPORTER", "must be none, otlp or console, got %q", c.TracesExporter)
	}
	for _, e := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", c.OTLPEndpoint}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.TracesEndpoint},
	} {
		if e.value == "" {
			continue
		}
		u, err := url.Parse(e.value)
		require(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", e.name,
			"%q is not an http:// or https:// URL", e.value)
	}
	require(c.OTLPProtocol == "http/protobuf" || c.OTLPProtocol == "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"must be http/protobuf or http/json (this build has no gRPC exporter), got %q", c.OTLPProtocol)
	if _, err := c.sampler(); err != nil {
		require(false, samplerVariable(err), "%v", err)
	}
}

// samplerError names the variable at fault.
type samplerError struct {
	variable string
	err      error
}

func (e samplerError) Error() string { return e.err.Error() }

func samplerVariable(err error) string {
	if se := (samplerError{}); errors.As(err, &se) {
		return se.variable
	}
	return "OTEL_TRACES_SAMPLER"
}

func (c Config) sampler() (sdktrace.Sampler, error) {
	ratio := 1.0
	if c.SamplerArg != "" {
		f, err := strconv.ParseFloat(c.SamplerArg, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, samplerError{"OTEL_TRACES_SAMPLER_ARG", fmt.Errorf("must be a ratio between 0 and 1, got %q", c.SamplerArg)}
		}
		ratio = f
	}
	root, parentBased := strings.CutPrefix(c.Sampler, "parentbased_")
	var s sdktrace.Sampler
	switch root {
	case "always_on":
		s = sdktrace.AlwaysSample()
	case "always_off":
		s = sdktrace.NeverSample()
	case "traceidratio":
		s = sdktrace.TraceIDRatioBased(ratio)
	default:
		return nil, samplerError{"OTEL_TRACES_SAMPLER", fmt.Errorf("must be always_on, always_off, traceidratio or parentbased_ and one of them, got %q", c.Sampler)}
	}
	if parentBased {
		s = sdktrace.ParentBased(s)
	}
	return s, nil
}

// Setup is what Start needs besides the configuration.
type Setup struct {
	// Name is the program's name, the service.name unless OTEL_SERVICE_NAME.
	Name string
	// Stdout takes the spans of the console exporter.
	Stdout io.Writer
	// Log, if set, takes the SDK's errors (a failed export).
	Log *slog.Logger
	// Processor, if set, receives every span as well, whatever the
	// exporter: tests record spans in memory with it (tracetest.SpanRecorder).
	Processor sdktrace.SpanProcessor
}

// Start returns the program's Tracer, nil when tracing is off (no exporter and
// no Processor), and the shutdown that flushes the spans still buffered; call
// it on the way out.
func Start(ctx context.Context, cfg Config, s Setup) (*Tracer, func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	if !cfg.enabled() && s.Processor == nil {
		return nil, noop, nil
	}
	sampler, err := cfg.sampler()
	if err != nil {
		return nil, noop, fmt.Errorf("%s: %w", samplerVariable(err), err)
	}
	res, err := programResource(cfg, s.Name)
	if err != nil {
		return nil, noop, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sampler)}
	if s.Processor != nil {
		opts = append(opts, sdktrace.WithSpanProcessor(s.Processor))
	}
	if cfg.enabled() {
		exp, err := exporter(ctx, cfg, s.Stdout)
		if err != nil {
			return nil, noop, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	if s.Log != nil {
		// The SDK's own errors (an export that failed) are process-wide; in
		// the program's JSON log rather than plain text on stderr.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { s.Log.Warn("tracing", "err", err) }))
	}
	return New(tp), tp.Shutdown, nil
}

// programResource is the SDK's attributes and OTEL_RESOURCE_ATTRIBUTES with service.name from OTEL_SERVICE_NAME, else
// OTEL_RESOURCE_ATTRIBUTES, else the program's name, as the specification
// orders them.
func programResource(cfg Config, program string) (*resource.Resource, error) {
	res, err := resource.New(context.Background(), resource.WithTelemetrySDK(), resource.WithFromEnv(), resource.WithSchemaURL(semconv.SchemaURL))
	if err != nil {
		return nil, fmt.Errorf("tracing resource (OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	name := cfg.ServiceName
	if _, ok := res.Set().Value(semconv.ServiceNameKey); name == "" && !ok {
		name = program
	}
	if name == "" {
		return res, nil
	}
	merged, err := resource.Merge(res, resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name)))
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	return merged, nil
}

func exporter(ctx context.Context, cfg Config, stdout io.Writer) (sdktrace.SpanExporter, error) {
	if cfg.TracesExporter == ExporterConsole {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(stdout))
		if err != nil {
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: console exporter: %w", err)
		}
		return exp, nil
	}
	var opts []otlptracehttp.Option
	switch {
	case cfg.TracesEndpoint != "":
		opts = append(opts, otlptracehttp.WithEndpointURL(cfg.TracesEndpoint))
	case cfg.OTLPEndpoint != "":
		opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimSuffix(cfg.OTLPEndpoint, "/")+"/v1/traces"))
	}
	if cfg.OTLPProtocol == "http/json" {
		opts = append(opts, otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON))
	}
	// New does not connect: a collector that is down costs dropped spans, never the start.
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: otlp exporter: %w", err)
	}
	return exp, nil
}

// FlushTimeout bounds the flush of the last spans at a stop: a collector that
// takes connections and never answers costs a stop no more than this.
const FlushTimeout = 2 * time.Second

// Shutdown runs a Start's shutdown bounded by timeout.
func Shutdown(shutdown func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		return fmt.Errorf("flush the last spans: %w", err)
	}
	return nil
}

// Tracer makes the kit's spans and carries their context through AMQP
// headers. A nil *Tracer is tracing off.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TextMapPropagator
}

// ScopeName is the instrumentation scope of the kit's spans.
const ScopeName = "github.com/inbox-template/payment-service/kit"

// New returns a Tracer of tp's, propagating W3C trace context and baggage.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{
		t:    tp.Tracer(ScopeName),
		prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// Span is one span, or nothing (the zero Span: tracing off or not sampled).
type Span struct{ s trace.Span }

// End ends the span.
func (s Span) End() {
	if s.s != nil {
		s.s.End()
	}
}

// Recording reports whether the span records anything: where it does not,
// skip building its attributes.
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// Fail marks the span as failed with err.
func (s Span) Fail(err error) {
	if s.s == nil || err == nil {
		return
	}
	s.s.RecordError(err)
	s.s.SetStatus(codes.Error, err.Error())
}

// Context returns the span's identity, invalid for the zero Span.
func (s Span) Context() trace.SpanContext {
	if s.s == nil {
		return trace.SpanContext{}
	}
	return s.s.SpanContext()
}

// Start starts a child span of ctx's span (an outside call, a commit). With
// tracing off it returns ctx and the zero Span.
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx, s := t.t.Start(ctx, name, trace.WithSpanKind(kind))
	return ctx, Span{s}
}

// Call wraps an outside call of a handler (a gateway's charge, a carrier's
// booking) in a client span named name, a child of the message's process
// span, failed with the call's error. With tracing off it returns call itself.
func Call[Req, Resp any](t *Tracer, name string, call func(context.Context, Req) (Resp, error)) func(context.Context, Req) (Resp, error) {
	if t == nil {
		return call
	}
	return func(ctx context.Context, req Req) (Resp, error) {
		ctx, span := t.Start(ctx, name, trace.SpanKindClient)
		defer span.End()
		resp, err := call(ctx, req)
		span.Fail(err)
		return resp, err
	}
}
