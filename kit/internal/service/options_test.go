package service

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
)

// shippingSettings stand for a handler's own settings.
type shippingSettings struct {
	CarrierTimeout time.Duration `envconfig:"CARRIER_TIMEOUT" default:"3s"`
}

func shippingOptions(s *shippingSettings) Options {
	return Options{
		Name: "shipping-service", Event: "order-paid", Exchange: "payments", RoutingKey: "order.paid",
		Settings: s,
		Check: func(cfg *Config, v *Checks) {
			v.Require(s.CarrierTimeout < cfg.HandlerTimeout, "CARRIER_TIMEOUT", "must be below HANDLER_TIMEOUT")
		},
		NewHandler:  func(*Kit) (consumer.Handler, error) { return nil, nil },
		OrderingKey: JSONField("order_id"),
	}
}

// One name drives the names; each variable still overrides its own.
func TestNamesDerivedFromTheService(t *testing.T) {
	cfg, err := LoadConfig(shippingOptions(&shippingSettings{}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"QUEUE": "shipping-service.order-paid", "DEAD_LETTER_EXCHANGE": "shipping-service.dlx",
		"DEAD_LETTER_QUEUE": "shipping-service.order-paid.dlq", "CONSUMER_NAME": "shipping-service",
		"EXCHANGE": "payments", "ROUTING_KEY": "order.paid",
		"DATABASE_URL": "postgres://postgres@localhost:5432/shipping_service?sslmode=disable",
	}
	got := Values(&cfg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if q := Topology(cfg).RetryQueue(time.Second); q != "shipping-service.order-paid.retry.1s" {
		t.Errorf("retry queue %q", q)
	}

	t.Setenv("QUEUE", "shipments.in")
	t.Setenv("CONSUMER_NAME", "shipping-eu")
	cfg, err = LoadConfig(shippingOptions(&shippingSettings{}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Queue != "shipments.in" || cfg.DeadLetterQueue != "shipments.in.dlq" || cfg.Consumer != "shipping-eu" {
		t.Errorf("overrides: queue %q, dead-letter queue %q, consumer %q", cfg.Queue, cfg.DeadLetterQueue, cfg.Consumer)
	}
}

// What to consume has no default in the kit: a service that names none
// refuses to start, naming the variable.
func TestNoDefaultExchange(t *testing.T) {
	opts := shippingOptions(&shippingSettings{})
	opts.Exchange, opts.RoutingKey = "", ""
	_, err := LoadConfig(opts)
	if err == nil || !strings.Contains(err.Error(), "EXCHANGE") || !strings.Contains(err.Error(), "ROUTING_KEY") {
		t.Fatalf("err = %v, want one naming EXCHANGE and ROUTING_KEY", err)
	}
	t.Setenv("EXCHANGE", "payments")
	t.Setenv("ROUTING_KEY", "order.paid")
	if _, err := LoadConfig(opts); err != nil {
		t.Fatalf("with the variables set: %v", err)
	}
}

func TestLoadConfigNamesTheVariableAtFault(t *testing.T) {
	tests := []struct {
		env      map[string]string
		variable string // "" means valid
	}{
		{map[string]string{}, ""},
		{map[string]string{"PREFETCH": "many"}, "PREFETCH"},
		{map[string]string{"PREFETCH": "0"}, "PREFETCH"},
		{map[string]string{"WORKERS": "193"}, "WORKERS"},
		{map[string]string{"WORKERS": "300", "PREFETCH": "300"}, ""},
		{map[string]string{"DB_COMMITTERS": "10"}, "DB_MAX_CONNS"},
		{map[string]string{"DB_COMMITTERS": "0"}, "DB_COMMITTERS"},
		{map[string]string{"GROUP_COMMIT_MAX": "0"}, "GROUP_COMMIT_MAX"},
		{map[string]string{"GROUP_COMMIT_MAX": "1", "GROUP_COMMIT_WAIT": "0s"}, ""},
		{map[string]string{"GROUP_COMMIT_WAIT": "2s"}, "GROUP_COMMIT_WAIT"},
		{map[string]string{"PPROF_ENABLED": "yes please"}, "PPROF_ENABLED"},
		{map[string]string{"AMQP_URL": "localhost:5672"}, "AMQP_URL"},
		{map[string]string{"AMQP_URL": "amqp://g:g@a:5681/v,amqp://g:g@b:5682/v"}, ""},
		{map[string]string{"AMQP_URL": "amqp://g:g@a:5681/v,amqp://g:g@b:5682/other"}, "AMQP_URL"},
		{map[string]string{"AMQP_URL": "amqp://g:g@a:5681/v,,amqp://g:g@b:5682/v"}, "AMQP_URL"},
		{map[string]string{"DATABASE_URL": "mysql://x"}, "DATABASE_URL"},
		{map[string]string{"RETRY_DELAYS": "1s,0s"}, "RETRY_DELAYS"},
		{map[string]string{"RETRY_DELAYS": "soon"}, "RETRY_DELAYS"},
		{map[string]string{"MAX_ATTEMPTS": "0"}, "MAX_ATTEMPTS"},
		{map[string]string{"MAX_HOLDS": "0"}, "MAX_HOLDS"},
		{map[string]string{"MAX_HOLDS": "10001"}, "MAX_HOLDS"},
		{map[string]string{"MAX_HOLDS": "1"}, ""},
		{map[string]string{"HTTP_ADDR": "bogus"}, "HTTP_ADDR"},
		{map[string]string{"HTTP_ADDR": ":99999"}, "HTTP_ADDR"},
		{map[string]string{"HTTP_ADDR": "127.0.0.1:0"}, ""},
		// The fault endpoints crash a replica: beyond loopback only with a token.
		{map[string]string{"FAULTS_ENABLED": "true"}, "FAULTS_TOKEN"},
		{map[string]string{"FAULTS_ENABLED": "true", "HTTP_ADDR": "0.0.0.0:8080"}, "FAULTS_TOKEN"},
		{map[string]string{"FAULTS_ENABLED": "true", "HTTP_ADDR": "127.0.0.1:8080"}, ""},
		{map[string]string{"FAULTS_ENABLED": "true", "HTTP_ADDR": "[::1]:8080"}, ""},
		{map[string]string{"FAULTS_ENABLED": "true", "HTTP_ADDR": "localhost:8080"}, ""},
		{map[string]string{"FAULTS_ENABLED": "true", "FAULTS_TOKEN": "t0ken"}, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_SAMPLER_ARG": "1.5", "OTEL_TRACES_SAMPLER": "traceidratio"}, "OTEL_TRACES_SAMPLER_ARG"},
		{map[string]string{"HANDLER_TIMEOUT": "31m"}, "HANDLER_TIMEOUT"},
		{map[string]string{"HANDLER_TIMEOUT": "2s"}, "CARRIER_TIMEOUT"}, // the handler's own check
		{map[string]string{"CARRIER_TIMEOUT": "soon"}, "CARRIER_TIMEOUT"},
		{map[string]string{"FAULTS_ENABLED": "maybe"}, "FAULTS_ENABLED"},
		{map[string]string{"LOG_LEVEL": "trace"}, "LOG_LEVEL"},
		{map[string]string{"DB_STATEMENT_TIMEOUT": "1ms"}, "DB_STATEMENT_TIMEOUT"},
		{map[string]string{"INBOX_RETENTION": "23h"}, "INBOX_RETENTION"},
		// 2 × (24h + 24h) of retry trips is above the 72h window.
		{map[string]string{"RETRY_DELAYS": "24h", "MAX_ATTEMPTS": "3", "INBOX_RETENTION": "72h"}, "INBOX_RETENTION"},
		// ... and they outlive the default 24h idempotency key.
		{map[string]string{"RETRY_DELAYS": "24h", "MAX_ATTEMPTS": "3", "INBOX_RETENTION": "96h"}, "IDEMPOTENCY_KEY_TTL"},
		{map[string]string{"RETRY_DELAYS": "24h", "MAX_ATTEMPTS": "3", "INBOX_RETENTION": "96h", "IDEMPOTENCY_KEY_TTL": "49h"}, ""},
		{map[string]string{"IDEMPOTENCY_KEY_TTL": "0s"}, "IDEMPOTENCY_KEY_TTL"},
		// 23 hourly retries and 24 handler runs of 15s fit in a day; 24 retries do not.
		{map[string]string{"RETRY_DELAYS": "1h", "MAX_ATTEMPTS": "24"}, ""},
		{map[string]string{"RETRY_DELAYS": "1h", "MAX_ATTEMPTS": "25"}, "IDEMPOTENCY_KEY_TTL"},
		// The handler runs count too: 99 × 10m of delays fit in a day, with
		// 100 runs of up to 10m each they do not.
		{map[string]string{"RETRY_DELAYS": "10m", "MAX_ATTEMPTS": "100"}, ""},
		{map[string]string{"RETRY_DELAYS": "10m", "MAX_ATTEMPTS": "100", "HANDLER_TIMEOUT": "10m"}, "IDEMPOTENCY_KEY_TTL"},
		// A batch may wait one statement timeout on its combined claim and one
		// more on a message's own claim in its savepoint pass: both within the
		// 15s a commit gets. A transaction per message waits once.
		{map[string]string{"DB_STATEMENT_TIMEOUT": "7s"}, ""},
		{map[string]string{"DB_STATEMENT_TIMEOUT": "8s"}, "DB_STATEMENT_TIMEOUT"},
		{map[string]string{"DB_STATEMENT_TIMEOUT": "14s", "GROUP_COMMIT_MAX": "1"}, ""},
		{map[string]string{"DB_STATEMENT_TIMEOUT": "15s", "GROUP_COMMIT_MAX": "1"}, "DB_STATEMENT_TIMEOUT"},
		{map[string]string{"INBOX_PRUNE_INTERVAL": "0"}, ""},
		{map[string]string{"INBOX_PRUNE_INTERVAL": "10ms"}, "INBOX_PRUNE_INTERVAL"},
		{map[string]string{"INBOX_PRUNE_BATCH": "0"}, "INBOX_PRUNE_BATCH"},
		{map[string]string{"INBOX_MODE": "later"}, "INBOX_MODE"},
		{map[string]string{"INBOX_MODE": "buffered"}, ""},
		{map[string]string{"BUFFER_RETRY_DELAYS": "1s,1ms"}, "BUFFER_RETRY_DELAYS"},
		{map[string]string{"BUFFER_MAX_ATTEMPTS": "0"}, "BUFFER_MAX_ATTEMPTS"},
		{map[string]string{"BUFFER_POLL_INTERVAL": "2m"}, "BUFFER_POLL_INTERVAL"},
		{map[string]string{"SINGLE_ACTIVE_CONSUMER": "sometimes"}, "SINGLE_ACTIVE_CONSUMER"},
		// In the buffered mode the handler's retries are the processing's: 300
		// runs, most five minutes apart, outlive the default 24h key; only there.
		{map[string]string{"BUFFER_MAX_ATTEMPTS": "300"}, ""},
		{map[string]string{"BUFFER_MAX_ATTEMPTS": "300", "INBOX_MODE": "buffered"}, "IDEMPOTENCY_KEY_TTL"},
	}
	for _, tt := range tests {
		t.Run(tt.variable, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := LoadConfig(shippingOptions(&shippingSettings{}))
			switch {
			case tt.variable == "" && err != nil:
				t.Fatalf("defaults rejected: %v", err)
			case tt.variable != "" && (err == nil || !strings.Contains(err.Error(), tt.variable)):
				t.Fatalf("err = %v, want one naming %s", err, tt.variable)
			}
		})
	}
}

func TestLogValueMasksSecrets(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://user:s3cret@broker:5672/, amqp://user:s3cret@broker2:5672/")
	// libpq also takes a password, and the client key's, in the query.
	t.Setenv("DATABASE_URL", "postgres://app:hunter2@db:5432/shipping?sslmode=verify-full&sslpassword=keyPass9&password=qPass7")
	cfg, err := LoadConfig(shippingOptions(&shippingSettings{}))
	if err != nil {
		t.Fatal(err)
	}
	v := LogValue(&cfg)
	if !strings.Contains(v["DATABASE_URL"], "sslmode=verify-full") {
		t.Errorf("DATABASE_URL=%s lost its sslmode", v["DATABASE_URL"])
	}
	for _, secret := range []string{"s3cret", "hunter2", "keyPass9", "qPass7"} {
		for k, val := range v {
			if strings.Contains(val, secret) {
				t.Errorf("%s=%s shows a password", k, val)
			}
		}
	}
	if v["PREFETCH"] != "192" || !strings.Contains(v["AMQP_URL"], "user:") || !strings.Contains(v["AMQP_URL"], "broker2") {
		t.Errorf("log value lost non-secret fields: %v", v)
	}
}

// Describe gives every variable with the default a service has with an empty
// environment: derived names included, the handler's settings last.
func TestDescribe(t *testing.T) {
	vars := shippingOptions(&shippingSettings{}).Describe()
	got := map[string]string{}
	for _, v := range vars {
		got[v.Name] = v.Default
		if v.Desc == "" && v.Name != "CARRIER_TIMEOUT" {
			t.Errorf("%s has no desc tag", v.Name)
		}
	}
	for name, want := range map[string]string{
		"QUEUE": "shipping-service.order-paid", "WORKERS": "128", "CARRIER_TIMEOUT": "3s", "EXCHANGE": "payments",
		"DATABASE_URL": "postgres://postgres@localhost:5432/shipping_service?sslmode=disable",
	} {
		if got[name] != want {
			t.Errorf("%s defaults to %q, want %q", name, got[name], want)
		}
	}
	if last := vars[len(vars)-1].Name; last != "CARRIER_TIMEOUT" {
		t.Errorf("last variable %s, want the handler's", last)
	}
}

// A handler's secret, tagged secret:"true", never reaches the start-up log.
func TestLogValueMasksTaggedSecrets(t *testing.T) {
	type settings struct {
		APIKey string `envconfig:"CARRIER_API_KEY" default:"k-123" secret:"true"`
	}
	if v := LogValue(&settings{APIKey: "k-123"}); v["CARRIER_API_KEY"] != "***" {
		t.Fatalf("CARRIER_API_KEY logged as %q", v["CARRIER_API_KEY"])
	}
	// An unset secret shows as unset: "***" would tell an operator it is set.
	if v := LogValue(&settings{}); v["CARRIER_API_KEY"] != "" {
		t.Fatalf("an unset CARRIER_API_KEY logged as %q, want \"\"", v["CARRIER_API_KEY"])
	}
}

// A service pins the kit settings it depends on: an unset variable takes the
// pinned value, a contradicting one refuses to start naming both values.
func TestRequiredSettingsArePinned(t *testing.T) {
	opts := shippingOptions(&shippingSettings{})
	opts.Requires = Requirements{Mode: ModeBuffered, SingleActiveConsumer: true}
	cfg, err := LoadConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InboxMode != ModeBuffered || !cfg.SingleActiveConsumer {
		t.Fatalf("unset variables: INBOX_MODE %q, SINGLE_ACTIVE_CONSUMER %v; want the pinned buffered, true", cfg.InboxMode, cfg.SingleActiveConsumer)
	}
	t.Run("repeated", func(t *testing.T) {
		t.Setenv("INBOX_MODE", "buffered")
		t.Setenv("SINGLE_ACTIVE_CONSUMER", "true")
		if _, err := LoadConfig(opts); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range []struct{ variable, value, want string }{
		{"INBOX_MODE", "inline", `is "inline", but shipping-service requires "buffered"`},
		{"SINGLE_ACTIVE_CONSUMER", "false", "is false, but shipping-service requires true"},
	} {
		t.Run(c.variable, func(t *testing.T) {
			t.Setenv(c.variable, c.value)
			_, err := LoadConfig(opts)
			if err == nil || !strings.Contains(err.Error(), c.variable+": "+c.want) {
				t.Fatalf("err = %v, want %s: %s", err, c.variable, c.want)
			}
		})
	}
	bad := opts
	bad.Requires.Mode = "later"
	if _, err := LoadConfig(bad); err == nil || !strings.Contains(err.Error(), "Requires.Mode") {
		t.Errorf("Requires.Mode later: err = %v", err)
	}
}

// The buffered mode gives order per key only with an OrderingKey: a service
// with none refuses to run in it unless it declares itself unordered.
func TestBufferedModeRefusesAServiceWithoutOrder(t *testing.T) {
	t.Setenv("INBOX_MODE", "buffered")
	opts := shippingOptions(&shippingSettings{})
	opts.OrderingKey = nil
	if _, err := LoadConfig(opts); err == nil || !strings.Contains(err.Error(), "INBOX_MODE: is buffered, but shipping-service gives no OrderingKey") {
		t.Fatalf("err = %v, want a refusal naming INBOX_MODE and OrderingKey", err)
	}
	opts.Unordered = true
	if _, err := LoadConfig(opts); err != nil {
		t.Fatalf("declared unordered: %v", err)
	}
	opts.OrderingKey = JSONField("order_id")
	if _, err := LoadConfig(opts); err == nil || !strings.Contains(err.Error(), "Unordered and an OrderingKey") {
		t.Fatalf("both: err = %v", err)
	}
	t.Setenv("INBOX_MODE", "inline")
	opts.OrderingKey, opts.Unordered = nil, false
	if _, err := LoadConfig(opts); err != nil {
		t.Fatalf("inline needs no ordering key: %v", err)
	}
}

// A service with no outside calls has no key lifetime: its retries are not
// bounded by one, the guard is off (KeyTTL 0), replay has no age limit, and
// an IDEMPOTENCY_KEY_TTL in its environment is refused as meaningless.
func TestServiceWithoutOutsideCallsHasNoKeyLifetime(t *testing.T) {
	opts := shippingOptions(&shippingSettings{})
	opts.NoOutsideCalls = true
	t.Setenv("RETRY_DELAYS", "24h")
	t.Setenv("MAX_ATTEMPTS", "3")
	t.Setenv("INBOX_RETENTION", "96h")
	cfg, err := LoadConfig(opts)
	if err != nil {
		t.Fatalf("two days of retries with no key to outlive: %v", err)
	}
	if cfg.IdempotencyKeyTTL != 0 || !cfg.NoOutsideCalls() || cfg.ReplayMaxAge() < 100*365*24*time.Hour {
		t.Errorf("key TTL %s, no outside calls %v, replay max age %s; want 0, true, unbounded",
			cfg.IdempotencyKeyTTL, cfg.NoOutsideCalls(), cfg.ReplayMaxAge())
	}
	t.Setenv("IDEMPOTENCY_KEY_TTL", "49h")
	if _, err := LoadConfig(opts); err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_KEY_TTL: is set, but shipping-service declares no outside calls") {
		t.Fatalf("err = %v, want IDEMPOTENCY_KEY_TTL refused", err)
	}
	opts.NoOutsideCalls = false
	if _, err := LoadConfig(opts); err != nil {
		t.Fatalf("with outside calls and a 49h key: %v", err)
	}
}

// checkedSettings validate themselves (SettingsChecker).
type checkedSettings struct {
	CarrierTimeout time.Duration `envconfig:"CARRIER_TIMEOUT" default:"3s"`
}

func (s *checkedSettings) Check(cfg *Config, v *Checks) {
	v.Require(s.CarrierTimeout < cfg.HandlerTimeout, "CARRIER_TIMEOUT", "must be below HANDLER_TIMEOUT")
}

// WithSettings loads the settings, checks them with their Check method and
// hands them to the handler's constructor typed.
func TestWithSettingsHandsTheHandlerTypedSettings(t *testing.T) {
	base := shippingOptions(nil)
	base.Settings, base.Check, base.NewHandler = nil, nil, nil
	var got *checkedSettings
	opts := WithSettings(base, func(k *Kit, s *checkedSettings) (consumer.Handler, error) {
		got = s
		return nil, nil
	})
	t.Setenv("CARRIER_TIMEOUT", "2s")
	cfg, err := LoadConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opts.NewHandler(&Kit{Config: cfg}); err != nil || got == nil || got.CarrierTimeout != 2*time.Second {
		t.Fatalf("the handler got %+v (%v), want CARRIER_TIMEOUT 2s", got, err)
	}
	running := got
	t.Setenv("CARRIER_TIMEOUT", "20s")
	if _, err := LoadConfig(opts); err == nil || !strings.Contains(err.Error(), "CARRIER_TIMEOUT: must be below HANDLER_TIMEOUT") {
		t.Errorf("Check not called: err = %v", err)
	}
	// From an outside review: a later load, refused or not, used to fill the
	// one S the earlier load had handed to its handler.
	if running.CarrierTimeout != 2*time.Second {
		t.Errorf("a later, refused load changed the running handler's settings: CARRIER_TIMEOUT %s", running.CarrierTimeout)
	}
	t.Setenv("CARRIER_TIMEOUT", "1s")
	cfg2, err := LoadConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opts.NewHandler(&Kit{Config: cfg2}); err != nil || got == running || got.CarrierTimeout != time.Second || running.CarrierTimeout != 2*time.Second {
		t.Errorf("second load: handler got %+v, first still %+v; want a new S with 1s, the first kept at 2s", got, running)
	}
	if _, err := opts.NewHandler(&Kit{}); err == nil {
		t.Error("a Kit without loaded settings built a handler")
	}
	twice := WithSettings(shippingOptions(&shippingSettings{}), func(*Kit, *checkedSettings) (consumer.Handler, error) { return nil, nil })
	if _, err := LoadConfig(twice); err == nil || !strings.Contains(err.Error(), "leave them unset") {
		t.Errorf("WithSettings over a NewHandler: err = %v", err)
	}
}

// Settings set by hand must be a pointer to a struct: a value used to
// compile and fail inside envconfig.
func TestSettingsByValueAreRefused(t *testing.T) {
	for _, s := range []any{shippingSettings{}, (*shippingSettings)(nil), new(int)} {
		opts := shippingOptions(nil)
		opts.Settings = s
		if _, err := LoadConfig(opts); err == nil || !strings.Contains(err.Error(), "Settings must be a pointer to a struct") {
			t.Errorf("Settings %T: err = %v", s, err)
		}
	}
}

// The start-up log shows what applies to the service.
func TestStartingValuesShowWhatApplies(t *testing.T) {
	opts := shippingOptions(&shippingSettings{})
	cfg, err := LoadConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	v := startingValues(opts, &cfg)
	if _, ok := v["OUTBOX_BATCH"]; ok {
		t.Error("OUTBOX_BATCH shown for a service that publishes nothing")
	}
	if v["IDEMPOTENCY_KEY_TTL"] != "24h" || v["CARRIER_TIMEOUT"] != "3s" {
		t.Errorf("IDEMPOTENCY_KEY_TTL %q, CARRIER_TIMEOUT %q", v["IDEMPOTENCY_KEY_TTL"], v["CARRIER_TIMEOUT"])
	}
	opts.Publishes, opts.NoOutsideCalls = []string{"shipments"}, true
	if cfg, err = LoadConfig(opts); err != nil {
		t.Fatal(err)
	}
	v = startingValues(opts, &cfg)
	if _, ok := v["IDEMPOTENCY_KEY_TTL"]; ok || v["OUTBOX_BATCH"] != "100" {
		t.Errorf("with Publishes and NoOutsideCalls: IDEMPOTENCY_KEY_TTL shown %v, OUTBOX_BATCH %q", ok, v["OUTBOX_BATCH"])
	}
}

// From an outside review: the handlers' read-only pool was opened beside a
// main pool of DB_MAX_CONNS, so a replica could hold more sessions than
// DB_MAX_CONNS says. The reader's share is taken out of it.
func TestReaderPoolIsTakenOutOfDBMaxConns(t *testing.T) {
	for _, c := range []struct {
		maxConns, committers int
		publishes            bool
		reader               int
	}{
		{10, 4, true, 2},  // the defaults: 4 committers, 2 look-ups, the relay, 1 spare
		{10, 4, false, 3}, // no relay
		{7, 4, true, 1},   // nothing spare: at least 1
		{20, 4, true, 12},
	} {
		opts := Options{}
		if c.publishes {
			opts.Publishes = []string{"events"}
		}
		cfg := Config{}
		cfg.MaxConns, cfg.DBCommitters = c.maxConns, c.committers
		got := readerConns(opts, cfg)
		if got != c.reader || got >= c.maxConns {
			t.Errorf("DB_MAX_CONNS %d, DB_COMMITTERS %d, publishes %v: reader pool %d, main pool %d; want reader %d of the %d",
				c.maxConns, c.committers, c.publishes, got, c.maxConns-got, c.reader, c.maxConns)
		}
	}
}

// A Decoder's ordering key counts as the service's order in the buffered
// mode; a Decoder beside the body functions it replaces is refused, naming
// both.
func TestDecoderReplacesTheBodyFunctions(t *testing.T) {
	t.Setenv("INBOX_MODE", "buffered")
	opts := shippingOptions(&shippingSettings{})
	opts.OrderingKey = nil
	type ev struct{ Order string }
	decode := func([]byte) (ev, error) { return ev{}, nil }
	opts.Decoder = consumer.Events[ev]{Decode: decode}
	if _, err := LoadConfig(opts); err == nil || !strings.Contains(err.Error(), "gives no OrderingKey") {
		t.Fatalf("a Decoder without an ordering key in the buffered mode: err = %v", err)
	}
	opts.Decoder = consumer.Events[ev]{Decode: decode, OrderingKey: func(e ev) string { return e.Order }}
	if _, err := LoadConfig(opts); err != nil {
		t.Fatalf("a Decoder with an ordering key: %v", err)
	}
	for name, mutate := range map[string]func(o *Options){
		"Unordered and an OrderingKey":                   func(o *Options) { o.Unordered = true },
		"the Decoder's ID replaces KeyFromBody":          func(o *Options) { o.KeyFromBody = JSONField("id") },
		"the Decoder's OrderingKey replaces OrderingKey": func(o *Options) { o.OrderingKey = JSONField("order_id") },
	} {
		bad := opts
		mutate(&bad)
		if _, err := LoadConfig(bad); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// The defaults are written once: a service whose environment sets nothing
// runs with what a zero consumer.Config, BufferedConfig or RelayConfig
// takes. They disagreed once (PREFETCH 192 and WORKERS 128 here, 32 and 8
// in the runtime), and a service and the kit's own tests then ran with
// different settings.
func TestDefaultsAreTheRuntimes(t *testing.T) {
	cfg, err := LoadConfig(shippingOptions(&shippingSettings{}))
	if err != nil {
		t.Fatal(err)
	}
	c, b, o := consumer.Defaults(), consumer.BufferedDefaults(), outbox.RelayDefaults()
	for _, d := range []struct {
		variable  string
		got, want any
	}{
		{"AMQP_HEARTBEAT", cfg.Heartbeat, c.Heartbeat},
		{"AMQP_HEARTBEAT (relay)", cfg.Heartbeat, o.Heartbeat},
		{"RECONNECT_MAX_WAIT", cfg.ReconnectMaxWait, c.ReconnectMaxWait},
		{"RECONNECT_MAX_WAIT (relay)", cfg.ReconnectMaxWait, o.ReconnectMaxWait},
		{"PREFETCH", cfg.Prefetch, c.Prefetch},
		{"WORKERS", cfg.Workers, c.Workers},
		{"DB_COMMITTERS", cfg.DBCommitters, c.Committers},
		{"GROUP_COMMIT_MAX", cfg.GroupCommitMax, c.GroupCommitMax},
		{"GROUP_COMMIT_WAIT", cfg.GroupCommitWait, c.GroupCommitWait},
		{"MAX_BODY_BYTES", cfg.MaxBodyBytes, c.MaxBodyBytes},
		{"RETRY_DELAYS", cfg.RetryDelays, c.Topology.RetryDelays},
		{"MAX_ATTEMPTS", cfg.MaxAttempts, c.MaxAttempts},
		{"PAUSE_AFTER_FAILURES", cfg.PauseAfterFailures, c.PauseAfterFailures},
		{"MAX_HOLDS", cfg.MaxHolds, c.MaxHolds},
		{"SHUTDOWN_TIMEOUT", cfg.ShutdownTimeout, c.ShutdownTimeout},
		{"BUFFER_RETRY_DELAYS", cfg.BufferRetryDelays, b.RetryDelays},
		{"BUFFER_MAX_ATTEMPTS", cfg.BufferMaxAttempts, b.MaxAttempts},
		{"BUFFER_POLL_INTERVAL", cfg.BufferPollInterval, b.PollInterval},
		{"OUTBOX_BATCH", cfg.OutboxBatch, o.Batch},
		{"OUTBOX_POLL_INTERVAL", cfg.OutboxPollInterval, o.PollInterval},
		{"OUTBOX_LEASE", cfg.OutboxLease, o.Lease},
		{"OUTBOX_RETRY_DELAYS", cfg.OutboxRetryDelays, o.RetryDelays},
		{"OUTBOX_MAX_ATTEMPTS", cfg.OutboxMaxAttempts, o.MaxAttempts},
	} {
		if !reflect.DeepEqual(d.got, d.want) {
			t.Errorf("%s defaults to %v, the runtime's default is %v", d.variable, d.got, d.want)
		}
	}
}
