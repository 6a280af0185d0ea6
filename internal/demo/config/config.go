// Package config loads the configuration of the programs that are not built on
// the service kit (the fake gateway, the order publisher, inboxctl's own
// commands) from environment variables with envconfig. The services' own
// configuration is the kit's (kit/internal/service) plus each handler's Settings.
package config

import (
	"github.com/inbox-template/payment-service/kit"
)

// Load fills cfg from the environment and validates it. Every error names the
// variable at fault.
func Load(cfg kit.Validator) error { return kit.LoadEnv(cfg) }

// LogValue renders cfg for the start-up log with secrets masked.
func LogValue(cfg any) map[string]string { return kit.LogValue(cfg) }
