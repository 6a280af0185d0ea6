package service

import (
	"fmt"

	"github.com/inbox-template/payment-service/kit/consumer"
)

// SettingsChecker is implemented by a service's settings that validate
// themselves against the kit's configuration, adding a failure per variable.
type SettingsChecker interface {
	Check(cfg *Config, v *Checks)
}

// WithSettings gives a service typed settings: every load of the
// configuration fills a new S from the environment next to the kit's own
// (S's fields carry envconfig tags), validates it with S's Check method if
// *S has one (SettingsChecker), and newHandler gets the S loaded with its
// Kit's configuration. It sets opts.Settings, opts.Check and
// opts.NewHandler, which must be unset:
//
//	return service.WithSettings(service.Options{Name: "refund-service", …},
//		func(k *service.Kit, s *Settings) (consumer.Handler, error) {
//			return refunds.NewHandler(s.BankURL), nil
//		})
func WithSettings[S any](opts Options, newHandler func(k *Kit, s *S) (consumer.Handler, error)) Options {
	if opts.Settings != nil || opts.Check != nil || opts.NewHandler != nil {
		opts.invalid = "WithSettings sets Settings, Check and NewHandler: leave them unset"
		return opts
	}
	opts.Settings, opts.typed = new(S), true // the type; each load fills its own
	if _, ok := any(new(S)).(SettingsChecker); ok {
		opts.Check = func(cfg *Config, v *Checks) { cfg.settings.(SettingsChecker).Check(cfg, v) }
	}
	opts.NewHandler = func(k *Kit) (consumer.Handler, error) {
		s, ok := k.Config.settings.(*S)
		if !ok {
			return nil, fmt.Errorf("service %s: the Kit's configuration holds no settings: load it with LoadConfig", opts.Name)
		}
		return newHandler(k, s)
	}
	return opts
}
