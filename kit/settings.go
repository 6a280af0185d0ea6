package kit

import (
	"github.com/inbox-template/payment-service/kit/internal/service"
)

// Validator is a program's configuration struct that checks itself: a tool
// beside the services (a fake callee, an operator's command) read the kit's
// way by LoadEnv.
type Validator = service.Validator

// LoadEnv fills cfg from the environment (envconfig tags: envconfig, default,
// desc, secret) and validates it; every error names the variable at fault.
// A service does not call it: Run loads the kit's Config and its Settings.
func LoadEnv(cfg Validator) error { return service.Load(cfg) }

// LogValue renders configuration structs as variable → value pairs for a
// start-up log line, masking passwords in URLs and every field tagged
// `secret:"true"`.
func LogValue(cfgs ...any) map[string]string { return service.LogValue(cfgs...) }

// ValidLogLevel reports whether s is a LOG_LEVEL the kit's logs know (debug,
// info, warn, error).
func ValidLogLevel(s string) bool { return service.ValidLogLevel(s) }

// LoadConfig reads svc's configuration (the kit's and its Settings) from the
// environment as Run reads it, for a tool that works on a service's queues,
// database and retention; every error names its variable.
func LoadConfig(svc Service) (Config, error) { return service.LoadConfig(svc) }
