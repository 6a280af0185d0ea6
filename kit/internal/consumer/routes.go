package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/wire"
)

// A service that consumes several events (OrderPlaced and OrderCancelled)
// binds its one work queue once per event, and each message goes to the
// event whose binding key its routing key matches: one inbox, one set of
// retry and dead-letter queues, one runtime, a Decoder and a handler per
// event.

// Route is one of the events of a service that consumes several: the
// messages published with a routing key that Key matches are decoded by
// Decoder and handled by Handler.
type Route struct {
	// Key is the binding key, a topic pattern: "*" stands for one word,
	// "#" for any number of words.
	Key     string
	Decoder Decoder
	Handler Handler
}

// Routed returns the Decoder and the Handler of a runtime that consumes
// each route's event. A message goes to the first route whose Key matches
// its routing key: the key it was published with, which a copy the runtime
// made (a retry, a hold, a dead letter replayed) carries in
// wire.HeaderOriginalKey, since it comes back through the default exchange
// under a queue's name. A message stored in the buffered inbox before its
// service consumed more than one event has no key and goes to the first
// route. A message no route matches is refused as an invalid event
// (dead-lettered inline, parked in the buffered mode), naming its key.
func Routed(routes []Route) (Decoder, Handler, error) {
	if len(routes) == 0 {
		return nil, nil, errors.New("no routes")
	}
	seen := map[string]bool{}
	types := map[reflect.Type]string{}
	for i, r := range routes {
		switch {
		case !ValidBindingKey(r.Key):
			return nil, nil, fmt.Errorf("binding key %q: want 1 to 255 bytes of UTF-8", r.Key)
		case seen[r.Key]:
			return nil, nil, fmt.Errorf("binding key %q is given twice", r.Key)
		case r.Decoder == nil || r.Handler == nil:
			return nil, nil, fmt.Errorf("binding key %q has no Decoder or no Handler", r.Key)
		}
		for _, before := range routes[:i] {
			if !strings.ContainsAny(r.Key, "*#") && TopicMatches(before.Key, r.Key) {
				return nil, nil, fmt.Errorf("binding key %q is never reached: %q, before it, matches every message it would", r.Key, before.Key)
			}
		}
		seen[r.Key] = true
		if t := EventType(r.Decoder); t != nil {
			if other, ok := types[t]; ok {
				return nil, nil, fmt.Errorf("binding keys %q and %q both decode %v: give one event type one binding key (a pattern matches several)", other, r.Key, t)
			}
			types[t] = r.Key
		}
	}
	rs := router(routes)
	return rs, routedHandler{rs}, nil
}

// router is the Decoder of several routes.
type router []Route

// route is the route of a message published with key.
func (rs router) route(key string) (Route, error) {
	if key == "" {
		return rs[0], nil
	}
	for _, r := range rs {
		if TopicMatches(r.Key, key) {
			return r, nil
		}
	}
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.Key
	}
	return Route{}, Permanent(reasonInvalidEvent, fmt.Errorf("no event of this service is bound to routing key %q (its binding keys: %s)",
		wire.ErrorText(key), strings.Join(keys, ", ")))
}

func (rs router) decode(key string, body []byte) (decoded, error) {
	r, err := rs.route(key)
	if err != nil {
		return decoded{}, err
	}
	return r.Decoder.decode(key, body)
}

// ordered: a route whose events name no ordering key makes each of its
// messages a key of its own.
func (rs router) ordered() bool {
	for _, r := range rs {
		if r.Decoder.ordered() {
			return true
		}
	}
	return false
}

// eventType is nil: a router decodes several.
func (rs router) eventType() reflect.Type { return nil }

// routedHandler runs the handler of each message's route: the route its
// Decoder took, found again from the same key.
type routedHandler struct{ rs router }

func (h routedHandler) Handle(ctx context.Context, msg Message) (Writes, error) {
	r, err := h.rs.route(msg.RoutingKey)
	if err != nil {
		return nil, err
	}
	return r.Handler.Handle(ctx, msg)
}

// TopicMatches reports whether a topic exchange would route a message
// published with key to a binding with pattern: words separated by dots,
// "*" matching one word and "#" any number of them, none included.
func TopicMatches(pattern, key string) bool {
	return topicMatch(strings.Split(pattern, "."), strings.Split(key, "."))
}

func topicMatch(p, k []string) bool {
	for len(p) > 0 {
		switch p[0] {
		case "#":
			for i := 0; i <= len(k); i++ {
				if topicMatch(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case "*":
			if len(k) == 0 {
				return false
			}
		default:
			if len(k) == 0 || k[0] != p[0] {
				return false
			}
		}
		p, k = p[1:], k[1:]
	}
	return len(k) == 0
}

// ValidBindingKey reports whether key can bind an event: not empty, at
// most 255 bytes (AMQP's limit), UTF-8.
func ValidBindingKey(key string) bool {
	return key != "" && len(key) <= 255 && utf8.ValidString(key)
}

// routingKeyOf is the routing key d was published with (originOf).
func routingKeyOf(d amqp.Delivery) string {
	_, key := originOf(d)
	return key
}

// originOf is the exchange and routing key d was published with: a copy the
// runtime made carries them in wire.HeaderOriginalExchange and
// wire.HeaderOriginalKey; a message the broker dead-lettered itself (past
// the delivery limit, or too large to copy), replayed by an operator
// through the default exchange, names them in its first death (x-death
// lists the most recent first).
func originOf(d amqp.Delivery) (exchange, key string) {
	if k, ok := d.Headers[wire.HeaderOriginalKey].(string); ok {
		exchange, _ = d.Headers[wire.HeaderOriginalExchange].(string)
		return exchange, k
	}
	if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
		if first, ok := deaths[len(deaths)-1].(amqp.Table); ok {
			if keys, ok := first["routing-keys"].([]any); ok && len(keys) > 0 {
				if k, ok := keys[0].(string); ok {
					exchange, _ = first["exchange"].(string)
					return exchange, k
				}
			}
		}
	}
	return d.Exchange, d.RoutingKey
}
