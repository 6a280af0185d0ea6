package producer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/payment/orders"
)

func collect(l Load) []Message { return slices.Collect(l.Messages()) }

func TestMessagesCounts(t *testing.T) {
	tests := []struct {
		name                             string
		load                             Load
		orders, dups, republishes, total int
	}{
		{"orders only", Load{Count: 50}, 50, 0, 0, 50},
		{"every order duplicated", Load{Count: 50, DuplicateRate: 1}, 50, 50, 0, 100},
		{"every order republished", Load{Count: 50, RepublishRate: 1}, 50, 0, 50, 100},
		{"both, always", Load{Count: 10, DuplicateRate: 1, RepublishRate: 1, Poison: 3}, 10, 10, 10, 33},
		{"poison only", Load{Poison: 11}, 0, 0, 0, 11},
		{"nothing", Load{}, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.load.RunID = "r"
			msgs := collect(tt.load)
			got := map[Kind]int{}
			for _, m := range msgs {
				got[m.Kind]++
			}
			if got[KindOrder] != tt.orders || got[KindDuplicate] != tt.dups || got[KindRepublish] != tt.republishes || len(msgs) != tt.total {
				t.Errorf("got %v and %d messages, want %d orders, %d duplicates, %d republishes, %d messages",
					got, len(msgs), tt.orders, tt.dups, tt.republishes, tt.total)
			}
		})
	}
}

// TestMessagesFollowTheSeed: the seed decides amounts, customers, currencies
// and which orders repeat; event ids are fresh on every run.
func TestMessagesFollowTheSeed(t *testing.T) {
	load := Load{RunID: "r", Count: 200, Seed: 42, DuplicateRate: 0.2, RepublishRate: 0.1, Poison: 5}
	a, b := collect(load), collect(load)
	load.Seed = 43
	c := collect(load)
	if fingerprint(t, a) != fingerprint(t, b) {
		t.Error("two runs with the same seed differ")
	}
	if fingerprint(t, a) == fingerprint(t, c) {
		t.Error("runs with seeds 42 and 43 are identical")
	}
	if a[0].Publishing.MessageId == b[0].Publishing.MessageId {
		t.Errorf("two runs reuse event id %s", a[0].Publishing.MessageId)
	}
	// Rates must not shift the amounts of a seed.
	load.Seed, load.DuplicateRate, load.RepublishRate = 42, 0, 0
	if got, want := amounts(t, collect(load)), amounts(t, a); !slices.Equal(got, want) {
		t.Error("changing the rates changed the amounts of seed 42")
	}
}

// fingerprint renders the seeded parts of the valid messages of a load.
func fingerprint(t *testing.T, msgs []Message) string {
	var b strings.Builder
	for _, m := range msgs {
		if m.Kind == KindPoison {
			fmt.Fprintf(&b, "%s %s\n", m.Kind, m.Poison)
			continue
		}
		o := decode(t, m.Publishing.Body)
		fmt.Fprintf(&b, "%s %s %s %d %s\n", m.Kind, o.OrderID, o.CustomerID, o.AmountCents, o.Currency)
	}
	return b.String()
}

func amounts(t *testing.T, msgs []Message) []int64 {
	var out []int64
	for _, m := range msgs {
		if m.Kind == KindOrder {
			out = append(out, decode(t, m.Publishing.Body).AmountCents)
		}
	}
	return out
}

func TestValidMessagesDecode(t *testing.T) {
	for _, noID := range []bool{false, true} {
		t.Run(fmt.Sprintf("no-message-id=%v", noID), func(t *testing.T) {
			load := Load{RunID: "r", Count: 300, Seed: 1, DuplicateRate: 0.5, RepublishRate: 0.5, NoMessageID: noID}
			first := map[string]orders.OrderPlaced{}
			for _, m := range collect(load) {
				o := decode(t, m.Publishing.Body)
				if err := checkValidProperties(m.Publishing, o, noID); err != nil {
					t.Fatal(err)
				}
				if o.AmountCents < minAmount || o.AmountCents > maxAmount {
					t.Errorf("amount %d outside %d..%d", o.AmountCents, minAmount, maxAmount)
				}
				if m.OrderID != o.OrderID {
					t.Errorf("message says order %s, body %s", m.OrderID, o.OrderID)
				}
				if err := checkRepeat(first, m.Kind, o); err != nil {
					t.Error(err)
				}
			}
			if len(first) != load.Count {
				t.Errorf("%d distinct orders, want %d", len(first), load.Count)
			}
		})
	}
}

// checkRepeat checks that a duplicate repeats its order's event id and a
// republish mints a new one for the same order.
func checkRepeat(first map[string]orders.OrderPlaced, kind Kind, o orders.OrderPlaced) error {
	f, seen := first[o.OrderID]
	switch {
	case kind == KindOrder && seen:
		return fmt.Errorf("order %s published twice as an order", o.OrderID)
	case kind == KindOrder:
		first[o.OrderID] = o
	case !seen:
		return fmt.Errorf("%s of order %s before the order", kind, o.OrderID)
	case kind == KindDuplicate && o.EventID != f.EventID:
		return fmt.Errorf("duplicate of %s has event id %s, want %s", o.OrderID, o.EventID, f.EventID)
	case kind == KindRepublish && (o.EventID == f.EventID || !sameOrder(o, f)):
		return fmt.Errorf("republish of %s = %+v, want the order %+v under a new event id", o.OrderID, o, f)
	}
	return nil
}

func sameOrder(a, b orders.OrderPlaced) bool {
	return a.OrderID == b.OrderID && a.CustomerID == b.CustomerID && a.AmountCents == b.AmountCents &&
		a.Currency == b.Currency && a.PlacedAt.Equal(b.PlacedAt)
}

// checkValidProperties checks the AMQP properties of a valid order.
func checkValidProperties(p amqp.Publishing, o orders.OrderPlaced, noMessageID bool) error {
	wantID := o.EventID
	if noMessageID {
		wantID = ""
	}
	switch {
	case p.ContentType != contentType:
		return fmt.Errorf("order %s: content type %q", o.OrderID, p.ContentType)
	case p.DeliveryMode != amqp.Persistent:
		return fmt.Errorf("order %s: delivery mode %d, want persistent", o.OrderID, p.DeliveryMode)
	case p.MessageId != wantID:
		return fmt.Errorf("order %s: message id %q, want %q", o.OrderID, p.MessageId, wantID)
	case p.Timestamp.IsZero():
		return fmt.Errorf("order %s: no timestamp", o.OrderID)
	}
	return nil
}

func TestPoisonInterleaved(t *testing.T) {
	msgs := collect(Load{RunID: "r", Count: 100, Poison: 4})
	var at []int
	for i, m := range msgs {
		if m.Kind == KindPoison {
			at = append(at, i)
		}
	}
	if want := []int{20, 41, 62, 83}; !slices.Equal(at, want) {
		t.Errorf("poison at %v, want %v", at, want)
	}
}

func TestPoisonShapes(t *testing.T) {
	kinds := PoisonKinds()
	msgs := collect(Load{RunID: "r", Poison: 2 * len(kinds), Now: func() time.Time { return time.Unix(1714566600, 0) }})
	for i, m := range msgs {
		want := kinds[i%len(kinds)]
		if m.Poison != want {
			t.Fatalf("poison %d is %s, want %s", i, m.Poison, want)
		}
		if err := checkPoison(m.Poison, m.Publishing.ContentType, m.Publishing.MessageId, m.Publishing.Body); err != nil {
			t.Error(err)
		}
		if wantID := fmt.Sprintf("poison-r-%d-%s", i, want); want != PoisonNoID && m.Publishing.MessageId != wantID {
			t.Errorf("poison %d has message id %q, want %q", i, m.Publishing.MessageId, wantID)
		}
	}
}

// checkPoison checks that a poison message has the one defect its kind names.
// The integration tests run it on what the broker delivered.
func checkPoison(kind PoisonKind, contentType, messageID string, body []byte) error {
	if kind != PoisonNoID && !strings.HasSuffix(messageID, "-"+string(kind)) {
		return fmt.Errorf("%s: message id %q does not name the kind", kind, messageID)
	}
	if want := wantContentType(kind); contentType != want {
		return fmt.Errorf("%s: content type %q, want %q", kind, contentType, want)
	}
	_, err := orders.Decode(body)
	switch kind {
	case PoisonNonUTF8:
		if utf8.Valid(body) {
			return fmt.Errorf("%s: body is valid UTF-8", kind)
		}
	case PoisonNoID:
		var fields map[string]any
		if jerr := json.Unmarshal(body, &fields); jerr != nil || messageID != "" || fields["event_id"] != nil {
			return fmt.Errorf("%s: message id %q, body %s: want neither", kind, messageID, body)
		}
	case PoisonOversize:
		if len(body) != MaxBodyBytes+1 {
			return fmt.Errorf("%s: body has %d bytes, want %d", kind, len(body), MaxBodyBytes+1)
		}
	case PoisonAmountFloat:
		if !strings.Contains(string(body), `"amount_cents":12.5`) {
			return fmt.Errorf("%s: body %s", kind, body)
		}
	case PoisonAmountString:
		if !strings.Contains(string(body), `"amount_cents":"4200"`) {
			return fmt.Errorf("%s: body %s", kind, body)
		}
	}
	if want := wantReason(kind); reason(err) != want {
		return fmt.Errorf("%s: orders.Decode says %v, want reason %q", kind, err, want)
	}
	return nil
}

func wantContentType(kind PoisonKind) string {
	if kind == PoisonTextPlain {
		return "text/plain"
	}
	return contentType
}

// wantReason is what orders.Decode makes of each kind; "" means it decodes,
// because only the size or the content type is wrong.
func wantReason(kind PoisonKind) string {
	return map[PoisonKind]string{
		PoisonTruncatedJSON:  orders.ReasonMalformedJSON,
		PoisonNonUTF8:        orders.ReasonInvalidUTF8,
		PoisonAmountString:   orders.ReasonInvalidAmount,
		PoisonAmountFloat:    orders.ReasonInvalidAmount,
		PoisonMissingFields:  orders.ReasonMissingField,
		PoisonZeroAmount:     orders.ReasonInvalidAmount,
		PoisonNegativeAmount: orders.ReasonInvalidAmount,
		PoisonBadCurrency:    orders.ReasonInvalidCurrency,
		PoisonNoID:           orders.ReasonMissingField,
	}[kind]
}

func reason(err error) string {
	var inv *orders.InvalidError
	if errors.As(err, &inv) {
		return inv.Reason
	}
	if err != nil {
		return "not an InvalidError: " + err.Error()
	}
	return ""
}

func decode(t *testing.T, body []byte) orders.OrderPlaced {
	t.Helper()
	o, err := orders.Decode(body)
	if err != nil {
		t.Fatalf("valid message %s: %v", body, err)
	}
	return o
}

func TestLoadValidate(t *testing.T) {
	tests := []struct {
		name string
		load Load
		want string // substring of the error; "" means valid
	}{
		{"valid", Load{RunID: "r1", Count: 1}, ""},
		{"empty run id", Load{}, "run id"},
		{"run id with space", Load{RunID: "a b"}, "run id"},
		{"run id too long", Load{RunID: strings.Repeat("r", 65)}, "run id"},
		{"negative count", Load{RunID: "r", Count: -1}, "count"},
		{"negative poison", Load{RunID: "r", Poison: -1}, "poison"},
		{"duplicate rate above 1", Load{RunID: "r", DuplicateRate: 1.5}, "duplicate rate"},
		{"republish rate below 0", Load{RunID: "r", RepublishRate: -0.1}, "republish rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.load.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("Validate() = %v, want an error about %q", err, tt.want)
			}
		})
	}
}
