package service

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/rabbit"
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
// compile. It sets opts.Decoder and opts.NewHandler, which must be unset
// (and so must KeyFromBody and OrderingKey: the Events' ID and OrderingKey
// replace them); a Decoder replaced afterwards by one of another event is
// refused at start:
//
//	return service.Consume(service.Options{Name: "refund-service", …},
//		consumer.Events[RefundRequested]{Decode: DecodeRefundRequested, ID: …},
//		func(k *service.Kit) (*Handler, error) { return &Handler{}, nil })
func Consume[E any, H consumer.HandlerOf[E]](opts Options, events consumer.Events[E], newHandler func(k *Kit) (H, error)) Options {
	if opts = withEvents("Consume", opts, events); opts.invalid != "" {
		return opts
	}
	opts.NewHandler = func(k *Kit) (consumer.Handler, error) { return typedHandler[E, H](opts.Name)(newHandler(k)) }
	return opts
}

// ConsumeWithSettings is Consume for a service with typed settings S, loaded
// and checked as WithSettings does. It sets opts.Decoder, opts.Settings,
// opts.Check and opts.NewHandler, which must be unset.
func ConsumeWithSettings[E, S any, H consumer.HandlerOf[E]](opts Options, events consumer.Events[E],
	newHandler func(k *Kit, s *S) (H, error)) Options {
	if opts.Settings != nil || opts.Check != nil {
		opts.invalid = "ConsumeWithSettings sets Settings, Check, Decoder and NewHandler: leave them unset"
		return opts
	}
	if opts = withEvents("ConsumeWithSettings", opts, events); opts.invalid != "" {
		return opts
	}
	return WithSettings(opts, func(k *Kit, s *S) (consumer.Handler, error) {
		return typedHandler[E, H](opts.Name)(newHandler(k, s))
	})
}

// ConsumeAlso adds a further event to a service that Consume or
// ConsumeWithSettings wired: the messages published to binding's exchange
// (the service's own if it names none) with a routing key its Key (a topic
// pattern) matches are decoded by events and handled by the handler
// newHandler builds, in the same inbox, with the same outbox and database,
// through the same work, retry and dead-letter queues (the work queue is
// bound once more, with binding). A message goes to the first event bound
// to the exchange it was published to whose key matches its routing key,
// the service's own (EXCHANGE, ROUTING_KEY) first, then in the order of the
// ConsumeAlso calls; one no binding matches is dead-lettered (parked)
// invalid_event. Each event type is consumed once.
func ConsumeAlso[E any, H consumer.HandlerOf[E]](opts Options, binding rabbit.Binding, events consumer.Events[E], newHandler func(k *Kit) (H, error)) Options {
	t := reflect.TypeFor[E]()
	fn := fmt.Sprintf("ConsumeAlso(%q)", binding.Key)
	switch {
	case opts.invalid != "":
		return opts
	case opts.event == nil:
		opts.invalid = fn + ": call Consume (or ConsumeWithSettings) first: the service's first event takes EXCHANGE and ROUTING_KEY"
	case !consumer.ValidBindingKey(binding.Key):
		opts.invalid = fn + ": want a binding key of 1 to 255 bytes of UTF-8 (dot-separated words, '*' one word, '#' any)"
	case binding.Exchange != "" && !consumer.ValidBindingKey(binding.Exchange):
		opts.invalid = fn + ": want an exchange name of at most 255 bytes of UTF-8"
	case events.Decode == nil:
		opts.invalid = fmt.Sprintf("%s: the Events[%s] have no Decode", fn, t)
	case t == opts.event:
		opts.invalid = fmt.Sprintf("%s: %s is the service's first event already: one binding an event type (a pattern matches several keys)", fn, t)
	}
	for _, m := range opts.more {
		switch {
		case opts.invalid != "":
		case m.binding == binding:
			opts.invalid = fn + ": the binding is given twice"
		case consumer.EventType(m.decoder) == t:
			opts.invalid = fmt.Sprintf("%s: %s is consumed with binding key %q already: one binding an event type", fn, t, m.binding.Key)
		}
	}
	if opts.invalid != "" {
		return opts
	}
	opts.more = append(slices.Clip(opts.more), moreEvents{binding: binding, decoder: events, newHandler: func(k *Kit) (consumer.Handler, error) {
		return typedHandler[E, H](opts.Name)(newHandler(k))
	}})
	return opts
}

// ConsumeAlsoWithSettings is ConsumeAlso for a handler that takes the
// service's settings S: the service was wired with ConsumeWithSettings and
// the same S.
func ConsumeAlsoWithSettings[E, S any, H consumer.HandlerOf[E]](opts Options, binding rabbit.Binding, events consumer.Events[E],
	newHandler func(k *Kit, s *S) (H, error)) Options {
	return ConsumeAlso(opts, binding, events, func(k *Kit) (H, error) {
		s, ok := k.Config.settings.(*S)
		if !ok {
			var none H
			return none, fmt.Errorf("ConsumeAlsoWithSettings(%q): the service's settings are not a %v: wire it with ConsumeWithSettings and the same settings type",
				binding.Key, reflect.TypeFor[S]())
		}
		return newHandler(k, s)
	})
}

func withEvents[E any](fn string, opts Options, events consumer.Events[E]) Options {
	switch {
	case opts.Decoder != nil || opts.NewHandler != nil:
		opts.invalid = fn + " sets Decoder and NewHandler: leave them unset"
	case opts.KeyFromBody != nil || opts.OrderingKey != nil:
		opts.invalid = fmt.Sprintf("%s: KeyFromBody and OrderingKey are the Events' ID and OrderingKey: give them to kit.Events[%s]",
			fn, reflect.TypeFor[E]())
	case events.Decode == nil:
		opts.invalid = fmt.Sprintf("%s: the Events[%s] have no Decode", fn, reflect.TypeFor[E]())
	default:
		opts.Decoder, opts.event = events, reflect.TypeFor[E]()
	}
	return opts
}

// typedHandler turns what a typed constructor returned into a Handler.
func typedHandler[E any, H consumer.HandlerOf[E]](service string) func(H, error) (consumer.Handler, error) {
	return func(h H, err error) (consumer.Handler, error) {
		switch {
		case err != nil:
			return nil, err
		case isNil(h):
			return nil, fmt.Errorf("service %s: the handler's constructor returned no handler and no error", service)
		}
		return consumer.Typed[E](h), nil
	}
}

// isNil reports whether v is nil, or an interface holding a nil pointer,
// map, function or channel.
func isNil(v any) bool {
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Invalid:
		return true
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Interface, reflect.Slice:
		return r.IsNil()
	}
	return false
}
