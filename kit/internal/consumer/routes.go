package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

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
	// Exchange is the topic exchange the event is published to, and Key
	// its binding key there, a topic pattern: "*" stands for one word, "#"
	// for any number of words.
	Exchange, Key string
	Decoder       Decoder
	Handler       Handler
}

// Routed returns the Decoder and the Handler of a runtime that consumes
// each route's event. A message goes to the first route whose Key matches
// the exchange and routing key it was published with (rabbit.Origin: a copy
// the runtime made, a retry, a hold or a dead letter replayed, carries them
// in wire.HeaderOriginalExchange and wire.HeaderOriginalKey, since it comes
// back through the default exchange under a queue's name). A message no
// route matches is refused as an invalid event (dead-lettered inline,
// parked in the buffered mode), naming its exchange and key.
func Routed(routes []Route) (Decoder, Handler, error) {
	if err := CheckRoutes(routes); err != nil {
		return nil, nil, err
	}
	for _, r := range routes {
		if r.Handler == nil {
			return nil, nil, fmt.Errorf("binding key %q has no Handler", r.Key)
		}
	}
	rs := router(routes)
	return rs, routedHandler{rs}, nil
}

// CheckRoutes refuses routes that would route a message two ways, or never
// reach one: Routed's checks, their handlers aside (a service's
// configuration runs them before it builds any).
func CheckRoutes(routes []Route) error {
	if len(routes) == 0 {
		return errors.New("no routes")
	}
	seen := map[origin]bool{}
	types := map[reflect.Type]string{}
	for i, r := range routes {
		switch {
		case r.Exchange == "":
			return fmt.Errorf("binding key %q has no exchange", r.Key)
		case !ValidBindingKey(r.Key):
			return fmt.Errorf("binding key %q: want 1 to 255 bytes of UTF-8", r.Key)
		case seen[origin{r.Exchange, r.Key}]:
			return fmt.Errorf("binding key %q on %s is given twice", r.Key, r.Exchange)
		case r.Decoder == nil:
			return fmt.Errorf("binding key %q has no Decoder", r.Key)
		}
		for _, before := range routes[:i] {
			if before.Exchange == r.Exchange && TopicCovers(before.Key, r.Key) {
				return fmt.Errorf("binding key %q on %s is never reached: %q, before it, matches every message it would",
					r.Key, r.Exchange, before.Key)
			}
		}
		seen[origin{r.Exchange, r.Key}] = true
		if t := EventType(r.Decoder); t != nil {
			if other, ok := types[t]; ok {
				return fmt.Errorf("binding keys %q and %q both decode %v: give one event type one binding key (a pattern matches several)", other, r.Key, t)
			}
			types[t] = r.Key
		}
	}
	return nil
}

// router is the Decoder of several routes.
type router []Route

// origin is where a message was published: its exchange and routing key.
type origin struct{ exchange, key string }

// route is the route of a message published at o. An origin unknown (a
// message published straight to the work queue, or a copy made before the
// kit kept origins, v0.3.0) is the first route's: a service that consumed
// one event took every such message, and still does. A message published
// to an exchange no route is bound to, which reached the queue through an
// exchange-to-exchange binding or as an alternate exchange's, is routed by
// its key alone where exactly one route's key matches it.
func (rs router) route(o origin) (Route, error) {
	if o.exchange == "" {
		return rs[0], nil
	}
	var byKey []Route
	bound := false
	for _, r := range rs {
		if r.Exchange == o.exchange {
			bound = true
			if TopicMatches(r.Key, o.key) {
				return r, nil
			}
		} else if TopicMatches(r.Key, o.key) {
			byKey = append(byKey, r)
		}
	}
	if !bound && len(byKey) == 1 {
		return byKey[0], nil
	}
	bindings := make([]string, len(rs))
	for i, r := range rs {
		bindings[i] = r.Exchange + " " + r.Key
	}
	return Route{}, Permanent(reasonInvalidEvent, fmt.Errorf("no event of this service is bound to exchange %q, routing key %q (its bindings: %s)",
		wire.ErrorText(o.exchange), wire.ErrorText(o.key), strings.Join(bindings, ", ")))
}

func (rs router) decode(o origin, body []byte) (decoded, error) {
	r, err := rs.route(o)
	if err != nil {
		return decoded{}, err
	}
	return r.Decoder.decode(o, body)
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
	r, err := h.rs.route(origin{msg.Exchange, msg.RoutingKey})
	if err != nil {
		return nil, err
	}
	return r.Handler.Handle(ctx, msg)
}

// TopicMatches reports whether a topic exchange would route a message
// published with key to a binding with pattern: words separated by dots,
// "*" matching one word and "#" any number of them, none included ("" is
// no word at all).
func TopicMatches(pattern, key string) bool {
	return topicMatch(words(pattern), words(key))
}

func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

// TopicCovers reports whether pattern p matches every key that pattern q
// does (a binding after p with q would never be reached). It may answer
// false where p does cover q in some contrived case ("#.#"): the check it
// serves then lets a shadowed binding start, as before it.
func TopicCovers(p, q string) bool { return covers(words(p), words(q)) }

func covers(p, q []string) bool {
	switch {
	case len(p) == 0:
		return len(q) == 0
	case p[0] == "#":
		for i := 0; i <= len(q); i++ {
			if covers(p[1:], q[i:]) {
				return true
			}
		}
		return false
	case len(q) == 0 || q[0] == "#":
		// q matches a key p cannot: none left, or q's "#" takes no word
		// or several where p needs one.
		return false
	case p[0] == "*" || p[0] == q[0]:
		return covers(p[1:], q[1:])
	}
	return false
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
