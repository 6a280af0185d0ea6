// Package producer generates OrderPlaced load for the payment service, with
// duplicates, producer retries and poison messages on purpose, and publishes it
// with publisher confirms, surviving connection loss without losing a message.
package producer

import (
	"encoding/json"
	"fmt"
	"iter"
	"math/rand/v2"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/payment/orders"
)

// Kind says why a message is part of the load.
type Kind string

// The kinds of message in a load.
const (
	KindOrder     Kind = "order"     // the first publish of an order
	KindDuplicate Kind = "duplicate" // the same message again: same message id, same body
	KindRepublish Kind = "republish" // the same order under a new event id, as a retrying producer would
	KindPoison    Kind = "poison"    // a message the consumer must dead-letter
)

// Message is one publishing of the load.
type Message struct {
	Kind       Kind
	Poison     PoisonKind // set when Kind is KindPoison
	OrderID    string
	Publishing amqp.Publishing
}

const (
	contentType = "application/json"
	appID       = "order-publisher"
	minAmount   = 100   // cents
	maxAmount   = 99999 // cents
	customers   = 1000  // size of the customer pool ids are drawn from
	maxRunIDLen = 64    // keeps order ids far below the consumer's 200-byte limit
)

// Load describes the messages of one run. Everything but the event ids and the
// timestamps follows from Seed, so a run can be replayed.
type Load struct {
	RunID         string
	Count         int     // distinct orders
	Seed          uint64  // drives amounts, currencies, customers, duplicates and republishes
	DuplicateRate float64 // probability that an order is published twice with the same message id
	RepublishRate float64 // probability that an order is published again under a new event id
	Poison        int     // poison messages, cycling through PoisonKinds
	NoMessageID   bool    // leave the message_id property off valid orders
	// Now stamps placed_at and the AMQP timestamp; nil means time.Now.
	Now func() time.Time
}

// Validate reports the first out-of-range setting.
func (l Load) Validate() error {
	switch {
	case l.RunID == "" || len(l.RunID) > maxRunIDLen || strings.ContainsFunc(l.RunID, invalidIDRune):
		return fmt.Errorf("run id %q must be 1 to %d printable characters without spaces", l.RunID, maxRunIDLen)
	case l.Count < 0:
		return fmt.Errorf("count must not be negative, got %d", l.Count)
	case l.Poison < 0:
		return fmt.Errorf("poison must not be negative, got %d", l.Poison)
	case !(l.DuplicateRate >= 0 && l.DuplicateRate <= 1): // also rejects NaN
		return fmt.Errorf("duplicate rate must be between 0 and 1, got %v", l.DuplicateRate)
	case !(l.RepublishRate >= 0 && l.RepublishRate <= 1):
		return fmt.Errorf("republish rate must be between 0 and 1, got %v", l.RepublishRate)
	}
	return nil
}

func invalidIDRune(r rune) bool { return r <= ' ' || r == 0x7f }

// Messages yields the load in publishing order. Poison messages are spread
// evenly between the orders, so a consumer must keep going after each one.
func (l Load) Messages() iter.Seq[Message] {
	return func(yield func(Message) bool) {
		rng := rand.New(rand.NewPCG(l.Seed, 0x6f72646572)) // "order"
		next := 0                                          // next poison message
		for n := range l.Count {
			for ; next < l.Poison && l.poisonSlot(next) <= n; next++ {
				if !yield(l.poison(next)) {
					return
				}
			}
			for _, m := range l.order(rng, n) {
				if !yield(m) {
					return
				}
			}
		}
		for ; next < l.Poison; next++ {
			if !yield(l.poison(next)) {
				return
			}
		}
	}
}

// poisonSlot is the number of orders published before poison message i.
func (l Load) poisonSlot(i int) int { return (i + 1) * l.Count / (l.Poison + 1) }

// order returns order n and the duplicate and republish that follow it. It
// draws the same random numbers whatever the rates, so the amounts of a seed do
// not depend on them.
func (l Load) order(rng *rand.Rand, n int) []Message {
	o := orders.OrderPlaced{
		EventID:     newEventID(),
		OrderID:     fmt.Sprintf("%s-%d", l.RunID, n),
		CustomerID:  fmt.Sprintf("cus-%d", 1+rng.IntN(customers)),
		AmountCents: minAmount + rng.Int64N(maxAmount-minAmount+1),
		Currency:    currency(rng),
		PlacedAt:    l.now().UTC(),
		// From n, not the random numbers: the amounts of a seed stay the same.
		ShippingAddress: fmt.Sprintf("%d Demo Street, 10115 Berlin", n+1),
	}
	duplicate := rng.Float64() < l.DuplicateRate
	republish := rng.Float64() < l.RepublishRate

	first := l.valid(KindOrder, o)
	msgs := []Message{first}
	if duplicate {
		dup := first
		dup.Kind = KindDuplicate
		msgs = append(msgs, dup)
	}
	if republish {
		o.EventID = newEventID()
		msgs = append(msgs, l.valid(KindRepublish, o))
	}
	return msgs
}

// currency is mostly EUR, so that most orders look alike, with a few others.
func currency(rng *rand.Rand) string {
	others := [...]string{"USD", "GBP", "CHF", "SEK", "PLN"}
	if i := rng.IntN(5 * len(others)); i < len(others) {
		return others[i]
	}
	return "EUR"
}

func (l Load) valid(kind Kind, o orders.OrderPlaced) Message {
	body, err := json.Marshal(o)
	if err != nil {
		// An OrderPlaced of strings, an integer and a UTC time always encodes.
		panic(fmt.Sprintf("encode %+v: %v", o, err))
	}
	p := l.publishing(o.EventID, body)
	if l.NoMessageID {
		p.MessageId = ""
	}
	return Message{Kind: kind, OrderID: o.OrderID, Publishing: p}
}

// publishing has the properties the consumer expects of every message.
func (l Load) publishing(messageID string, body []byte) amqp.Publishing {
	return amqp.Publishing{
		ContentType:  contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    messageID,
		Timestamp:    l.now(),
		AppId:        appID,
		Body:         body,
	}
}

func (l Load) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}
