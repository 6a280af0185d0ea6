// Package config loads each program's configuration from environment variables
// (envconfig), validates it, and renders it for the start-up log with secrets masked.
package config

import (
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// validator is implemented by every configuration struct of this package.
type validator interface {
	Validate() error
}

// Load fills cfg from the environment and validates it. Every error names the
// variable at fault.
func Load(cfg validator) error {
	if err := envconfig.Process("", cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	return nil
}

// LogValue renders cfg as variable → value pairs for the start-up log, masking
// passwords in URLs and every field tagged `secret:"true"`.
func LogValue(cfg any) map[string]string {
	out := map[string]string{}
	collect(reflect.ValueOf(cfg), out)
	return out
}

func collect(v reflect.Value, out map[string]string) {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
			collect(v.Field(i), out)
			continue
		}
		name := f.Tag.Get("envconfig")
		if name == "" {
			continue
		}
		val := fmt.Sprint(v.Field(i).Interface())
		if f.Tag.Get("secret") == "true" {
			val = "***"
		}
		out[name] = maskURL(val)
	}
}

// maskURL hides the password of a URL with credentials; other values pass through.
func maskURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// checks collects validation failures so that one start reports all of them.
type checks []string

func (c *checks) require(ok bool, variable, format string, args ...any) {
	if !ok {
		*c = append(*c, variable+": "+fmt.Sprintf(format, args...))
	}
}

func (c checks) err() error {
	if len(c) == 0 {
		return nil
	}
	return fmt.Errorf("invalid %s", strings.Join(c, "; "))
}

func (c *checks) url(variable, value string, schemes ...string) {
	u, err := url.Parse(value)
	ok := err == nil && u.Host != ""
	if ok {
		ok = false
		for _, s := range schemes {
			ok = ok || u.Scheme == s
		}
	}
	c.require(ok, variable, "%q is not a %s URL", value, strings.Join(schemes, " or "))
}
