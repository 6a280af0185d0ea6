package service

import (
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Validator is a configuration struct that checks itself.
type Validator interface {
	Validate() error
}

// Load fills cfg from the environment (envconfig) and validates it. Every
// error names the variable at fault.
func Load(cfg Validator) error {
	if err := envconfig.Process("", cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	return nil
}

// LogValue renders configuration structs as variable → value pairs for the
// start-up log, masking passwords in URLs and every field tagged
// `secret:"true"`.
func LogValue(cfgs ...any) map[string]string { return values(cfgs, true) }

// Values renders configuration structs as variable → value pairs, secrets
// included.
func Values(cfgs ...any) map[string]string { return values(cfgs, false) }

func values(cfgs []any, mask bool) map[string]string {
	out := map[string]string{}
	for _, cfg := range cfgs {
		if cfg != nil {
			collect(reflect.ValueOf(cfg), out, mask)
		}
	}
	return out
}

func collect(v reflect.Value, out map[string]string, mask bool) {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
			collect(v.Field(i), out, mask)
			continue
		}
		name := f.Tag.Get("envconfig")
		if name == "" {
			continue
		}
		val := render(v.Field(i).Interface())
		if mask && f.Tag.Get("secret") == "true" && val != "" { // unset shows as unset
			val = "***"
		}
		if mask {
			val = maskURL(val)
		}
		out[name] = val
	}
}

// render writes a value the way envconfig reads it back.
func render(v any) string {
	switch v := v.(type) {
	case time.Duration:
		return duration(v)
	case []time.Duration:
		parts := make([]string, len(v))
		for i, d := range v {
			parts[i] = duration(d)
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}

// duration writes a duration as a person would: 5m, not 5m0s; 336h, not
// 336h0m0s.
func duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// maskURL hides the password of a URL with credentials, or of each URL of a
// comma-separated list (AMQP_URL's cluster nodes, spaces around the commas
// allowed, as rabbit.ParseNodes reads them); other values pass through. A
// list part that does not parse but holds credentials is hidden whole.
func maskURL(s string) string {
	if parts := strings.Split(s, ","); len(parts) > 1 && strings.Count(s, "://") > 1 {
		for i, p := range parts {
			parts[i] = maskOne(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
	return maskOne(s)
}

func maskOne(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil && strings.Contains(s, "@"):
		return "***"
	case err != nil:
		return s
	}
	// A password can sit in the query too (libpq's password, sslpassword).
	masked := false
	if q := u.Query(); u.Scheme != "" && len(q) > 0 {
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") {
				q.Set(k, "xxxxx")
				masked = true
			}
		}
		if masked {
			u.RawQuery = q.Encode()
		}
	}
	switch {
	case u.User != nil:
		return u.Redacted()
	case masked:
		return u.String()
	}
	return s
}

// Checks collects validation failures, so that one start reports all of them,
// each naming its variable.
type Checks []string

// Require records a failure of variable unless ok.
func (c *Checks) Require(ok bool, variable, format string, args ...any) {
	if !ok {
		*c = append(*c, variable+": "+fmt.Sprintf(format, args...))
	}
}

// Failed reports whether a check of any of the variables has failed already:
// a check that derives from them stays silent rather than blame another
// variable for their fault.
func (c Checks) Failed(variables ...string) bool {
	for _, f := range c {
		for _, v := range variables {
			if strings.HasPrefix(f, v+": ") {
				return true
			}
		}
	}
	return false
}

// URL requires value to be a URL with a host and one of the schemes.
func (c *Checks) URL(variable, value string, schemes ...string) {
	u, err := url.Parse(value)
	ok := err == nil && u.Host != ""
	if ok {
		ok = false
		for _, s := range schemes {
			ok = ok || u.Scheme == s
		}
	}
	c.Require(ok, variable, "%q is not a %s URL", value, strings.Join(schemes, " or "))
}

// AMQPURL checks an AMQP_URL value: one amqp:// or amqps:// URL, or a
// cluster's nodes separated by commas (rabbit.ParseNodes).
func (c *Checks) AMQPURL(variable, value string) {
	if _, err := rabbit.ParseNodes(value); err != nil {
		c.Require(false, variable, "want one amqp:// or amqps:// URL, or a cluster's nodes separated by commas: %v", err)
	}
}

// InFlightWindow checks an outside API's in-flight window against the
// handler's retries. An API with idempotency keys answers 409 for a key
// whose first request it lost in flight until window has passed, then lets
// a retry take the key over. Retries all spent inside the window
// dead-letter the message while the lost request may still have taken
// effect (a card charged, a pickup booked, nothing of it recorded). call
// names what is lost ("a charge"), api whom ("the gateway"). The check
// stays silent when the retries' own variables failed.
func (c *Checks) InFlightWindow(variable string, window time.Duration, cfg *Config, call, api string) {
	if c.Failed(cfg.RetryVariables()...) {
		return // the retries are wrong already: nothing to compare the window with
	}
	if window <= 0 {
		c.Require(false, variable, "must be positive (your API's window), got %s", window)
		return
	}
	shortest := cfg.ShortestRetrySpan()
	c.Require(window < shortest, variable,
		"is %s, but the retries of %s may all be spent within %s "+
			"(each delay shortened by up to %.0f%% of jitter): %s stuck in flight at %s would be "+
			"dead-lettered before %s lets a retry take it over; lengthen the retries, or set "+
			"%s to your API's window",
		window, cfg.RetrySettings(), shortest, 100*consumer.RetryJitter, call, api, api, variable)
}

// Err is nil without failures, else one error listing them all.
func (c Checks) Err() error {
	if len(c) == 0 {
		return nil
	}
	return fmt.Errorf("invalid %s", strings.Join(c, "; "))
}

// Variable is one environment variable a program reads: its name, its default
// and what it is for (the field's desc tag).
type Variable struct {
	Name, Default, Desc string
}

// Describe lists the variables of a configuration struct in field order, with
// the defaults of their default tags.
func Describe(spec any) []Variable {
	var out []Variable
	describe(reflect.TypeOf(spec), &out)
	return out
}

func describe(t reflect.Type, out *[]Variable) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
			describe(f.Type, out)
			continue
		}
		if name := f.Tag.Get("envconfig"); name != "" {
			*out = append(*out, Variable{Name: name, Default: f.Tag.Get("default"), Desc: f.Tag.Get("desc")})
		}
	}
}

// Describe lists every variable a service reads, the kit's and its Settings',
// with the defaults it has when the environment sets none: the derived names
// included.
func (o Options) Describe() []Variable {
	cfg := prefill(o)
	cfg.derive(o)
	derived := Values(&cfg)
	vars := Describe(&Config{})
	for i, v := range vars {
		if v.Default == "" {
			vars[i].Default = derived[v.Name]
		}
		// What the service pins (Options.Requires) is its default: the only
		// value it starts with.
		switch {
		case v.Name == "INBOX_MODE" && o.Requires.Mode != "":
			vars[i].Default = o.Requires.Mode
		case v.Name == "SINGLE_ACTIVE_CONSUMER" && o.Requires.SingleActiveConsumer:
			vars[i].Default = "true"
		}
	}
	if o.Settings != nil {
		vars = append(vars, Describe(o.Settings)...)
	}
	return vars
}
