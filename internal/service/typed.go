package service

import (
	"github.com/inbox-template/payment-service/internal/consumer"
)

// SettingsChecker is implemented by a service's settings that validate
// themselves against the kit's configuration, adding a failure per variable.
type SettingsChecker interface {
	Check(cfg *Config, v *Checks)
}

// WithSettings gives a service typed settings: the kit loads a new S from
// the environment next to its own configuration (S's fields carry envconfig
// tags), validates it with S's Check method if *S has one (SettingsChecker),
// and hands it to newHandler. It sets opts.Settings, opts.Check and
// opts.NewHandler, which must be unset:
//
//	return service.WithSettings(service.Options{Name: "refund-service", …},
//		func(k *service.Kit, s *Settings) (consumer.Handler, error) {
//			return refunds.NewHandler(s.BankURL), nil
//		})
func WithSettings[S any](opts Options, newHandler func(k *Kit, s *S) (consumer.Handler, error)) Options {
	s := new(S)
	if opts.Settings != nil || opts.Check != nil || opts.NewHandler != nil {
		opts.invalid = "WithSettings sets Settings, Check and NewHandler: leave them unset"
		return opts
	}
	opts.Settings = s
	if c, ok := any(s).(SettingsChecker); ok {
		opts.Check = c.Check
	}
	opts.NewHandler = func(k *Kit) (consumer.Handler, error) { return newHandler(k, s) }
	return opts
}
