package producer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// PoisonKind names one way a message can be unprocessable. The names appear in
// poison message ids and in the summary.
type PoisonKind string

// The poison kinds, each breaking one rule of the message contract.
const (
	PoisonTruncatedJSON  PoisonKind = "truncated-json"  // the first half of a valid body
	PoisonNonUTF8        PoisonKind = "non-utf8"        // invalid UTF-8 bytes inside customer_id
	PoisonAmountString   PoisonKind = "amount-string"   // "amount_cents":"4200"
	PoisonAmountFloat    PoisonKind = "amount-float"    // "amount_cents":12.5
	PoisonMissingFields  PoisonKind = "missing-fields"  // no customer_id and no amount_cents
	PoisonZeroAmount     PoisonKind = "zero-amount"     // "amount_cents":0
	PoisonNegativeAmount PoisonKind = "negative-amount" // "amount_cents":-4200
	PoisonBadCurrency    PoisonKind = "bad-currency"    // "currency":"EURO"
	PoisonNoID           PoisonKind = "no-id"           // no message_id property and no event_id field
	PoisonOversize       PoisonKind = "oversize"        // a valid body padded to MaxBodyBytes+1 bytes
	PoisonTextPlain      PoisonKind = "text-plain"      // a valid body sent as content type text/plain
)

// MaxBodyBytes is the payment service's default body limit (MAX_BODY_BYTES);
// the oversize poison message is one byte longer.
const MaxBodyBytes = 64 << 10

// PoisonKinds returns every kind in the fixed order that -poison cycles through.
func PoisonKinds() []PoisonKind {
	return []PoisonKind{
		PoisonTruncatedJSON, PoisonNonUTF8, PoisonAmountString, PoisonAmountFloat,
		PoisonMissingFields, PoisonZeroAmount, PoisonNegativeAmount, PoisonBadCurrency,
		PoisonNoID, PoisonOversize, PoisonTextPlain,
	}
}

// poison returns poison message i. Its order id is outside the run's orders, so
// a consumer that charged it anyway shows up in the invariants report.
func (l Load) poison(i int) Message {
	kinds := PoisonKinds()
	kind := kinds[i%len(kinds)]
	id := fmt.Sprintf("poison-%s-%d-%s", l.RunID, i, kind)
	orderID := fmt.Sprintf("%s-poison-%d", l.RunID, i)
	fields := map[string]any{
		"event_id":     id,
		"order_id":     orderID,
		"customer_id":  "cus-poison",
		"amount_cents": 4200,
		"currency":     "EUR",
		"placed_at":    l.now().UTC(),
	}
	p := l.publishing(id, nil)
	switch kind {
	case PoisonTruncatedJSON:
		b := mustJSON(fields)
		p.Body = b[:len(b)/2]
	case PoisonNonUTF8:
		// json.Marshal would replace invalid bytes with U+FFFD, so splice them in.
		fields["customer_id"] = "cus-NONUTF8"
		p.Body = bytes.Replace(mustJSON(fields), []byte("NONUTF8"), []byte("\xff\xfe\xfd"), 1)
	case PoisonAmountString:
		fields["amount_cents"] = "4200"
	case PoisonAmountFloat:
		fields["amount_cents"] = 12.5
	case PoisonMissingFields:
		delete(fields, "customer_id")
		delete(fields, "amount_cents")
	case PoisonZeroAmount:
		fields["amount_cents"] = 0
	case PoisonNegativeAmount:
		fields["amount_cents"] = -4200
	case PoisonBadCurrency:
		fields["currency"] = "EURO"
	case PoisonNoID:
		delete(fields, "event_id")
		p.MessageId = ""
	case PoisonOversize:
		p.Body = padded(fields, MaxBodyBytes+1)
	case PoisonTextPlain:
		p.ContentType = "text/plain"
	}
	if p.Body == nil {
		p.Body = mustJSON(fields)
	}
	return Message{Kind: KindPoison, Poison: kind, OrderID: orderID, Publishing: p}
}

// padded encodes fields with an extra "padding" field that makes the body
// exactly size bytes, so that only its size is wrong.
func padded(fields map[string]any, size int) []byte {
	fields["padding"] = ""
	n := size - len(mustJSON(fields))
	fields["padding"] = strings.Repeat("x", max(n, 0))
	return mustJSON(fields)
}

func mustJSON(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// The values above are strings, numbers and a UTC time: they always encode.
		panic(fmt.Sprintf("encode poison body: %v", err))
	}
	return b
}
