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

// Consume wires a handler typed to its event with the Events that decodes
// it: E is one type for both, so that a handler of another event does not
// compile. It sets opts.Decoder and opts.NewHandler, which must be unset:
//
//	return service.Consume(service.Options{Name: "refund-service", …},
//		consumer.Events[RefundRequested]{Decode: DecodeRefundRequested, ID: …},
//		func(k *service.Kit) (consumer.HandlerOf[RefundRequested], error) {
//			return &Handler{}, nil
//		})
func Consume[E any](opts Options, events consumer.Events[E], newHandler func(k *Kit) (consumer.HandlerOf[E], error)) Options {
	if opts = withEvents(opts, events); opts.invalid != "" {
		return opts
	}
	opts.NewHandler = func(k *Kit) (consumer.Handler, error) { return typedHandler[E](opts.Name)(newHandler(k)) }
	return opts
}

// ConsumeWithSettings is Consume for a service with typed settings S, loaded
// and checked as WithSettings does. It sets opts.Decoder, opts.Settings,
// opts.Check and opts.NewHandler, which must be unset.
func ConsumeWithSettings[E, S any](opts Options, events consumer.Events[E],
	newHandler func(k *Kit, s *S) (consumer.HandlerOf[E], error)) Options {
	if opts = withEvents(opts, events); opts.invalid != "" {
		return opts
	}
	return WithSettings(opts, func(k *Kit, s *S) (consumer.Handler, error) {
		return typedHandler[E](opts.Name)(newHandler(k, s))
	})
}

func withEvents[E any](opts Options, events consumer.Events[E]) Options {
	switch {
	case opts.Decoder != nil || opts.NewHandler != nil:
		opts.invalid = "Consume sets Decoder and NewHandler: leave them unset"
	case events.Decode == nil:
		opts.invalid = fmt.Sprintf("Consume: the Events[%T] have no Decode", *new(E))
	default:
		opts.Decoder = events
	}
	return opts
}

// typedHandler turns what a typed constructor returned into a Handler.
func typedHandler[E any](service string) func(consumer.HandlerOf[E], error) (consumer.Handler, error) {
	return func(h consumer.HandlerOf[E], err error) (consumer.Handler, error) {
		switch {
		case err != nil:
			return nil, err
		case h == nil:
			return nil, fmt.Errorf("service %s: the handler's constructor returned no handler and no error", service)
		}
		return consumer.Typed(h), nil
	}
}
