package orders_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/payment/orders"
)

// validFields is a valid event as JSON fields. Tests derive bodies from it by
// replacing or deleting one field, so each case differs from a valid body in
// exactly the way its name says.
var validFields = [][2]string{
	{"event_id", `"evt-1"`},
	{"order_id", `"ord-1"`},
	{"customer_id", `"cus-1"`},
	{"amount_cents", `1250`},
	{"currency", `"EUR"`},
	{"placed_at", `"2024-05-01T12:30:00Z"`},
}

// body renders validFields with the given fields replaced (a value of "" deletes
// the field) and extra raw fields appended.
func body(replace map[string]string, extra ...string) string {
	var parts []string
	for _, f := range validFields {
		v, ok := replace[f[0]]
		if !ok {
			v = f[1]
		}
		if v != "" {
			parts = append(parts, `"`+f[0]+`":`+v)
		}
	}
	return "{" + strings.Join(append(parts, extra...), ",") + "}"
}

func valid() string { return body(nil) }

func TestDecodeValid(t *testing.T) {
	want := orders.OrderPlaced{
		EventID:     "evt-1",
		OrderID:     "ord-1",
		CustomerID:  "cus-1",
		AmountCents: 1250,
		Currency:    "EUR",
		PlacedAt:    time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC),
	}
	tests := []struct {
		name string
		body string
		want func(o *orders.OrderPlaced)
	}{
		{name: "all fields", body: valid()},
		{name: "unknown extra fields allowed", body: body(nil, `"channel":"web"`, `"items":[{"sku":"A","qty":2}]`, `"note":null`)},
		{name: "whitespace around the object", body: " \n\t" + valid() + "\n "},
		{name: "fields in another order", body: `{"placed_at":"2024-05-01T12:30:00Z","currency":"EUR","amount_cents":1250,"customer_id":"cus-1","order_id":"ord-1","event_id":"evt-1"}`},
		{name: "placed_at with offset and fraction", body: body(map[string]string{"placed_at": `"2024-05-01T14:30:00.123+02:00"`}),
			want: func(o *orders.OrderPlaced) { o.PlacedAt = time.Date(2024, 5, 1, 12, 30, 0, 123e6, time.UTC) }},
		{name: "amount of one minor unit", body: body(map[string]string{"amount_cents": "1"}),
			want: func(o *orders.OrderPlaced) { o.AmountCents = 1 }},
		{name: "largest int64 amount", body: body(map[string]string{"amount_cents": "9223372036854775807"}),
			want: func(o *orders.OrderPlaced) { o.AmountCents = 1<<63 - 1 }},
		{name: "another ISO currency", body: body(map[string]string{"currency": `"CHF"`}),
			want: func(o *orders.OrderPlaced) { o.Currency = "CHF" }},
		{name: "non-ASCII ids", body: body(map[string]string{"customer_id": `"cus-zoë-日本"`}),
			want: func(o *orders.OrderPlaced) { o.CustomerID = "cus-zoë-日本" }},
		{name: "id of exactly 200 bytes", body: body(map[string]string{"order_id": `"` + strings.Repeat("o", 200) + `"`}),
			want: func(o *orders.OrderPlaced) { o.OrderID = strings.Repeat("o", 200) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := orders.Decode([]byte(tt.body))
			if err != nil {
				t.Fatalf("Decode(%s) = %v, want no error", tt.body, err)
			}
			w := want
			if tt.want != nil {
				tt.want(&w)
			}
			if !equal(got, w) {
				t.Errorf("Decode(%s)\n got %+v\nwant %+v", tt.body, got, w)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	v := valid()
	tests := []struct {
		name   string
		body   string
		reason string
	}{
		{"empty body", "", orders.ReasonMalformedJSON},
		{"whitespace only", "  \n", orders.ReasonMalformedJSON},
		{"truncated JSON", v[:len(v)/2], orders.ReasonMalformedJSON},
		{"truncated before closing brace", v[:len(v)-1], orders.ReasonMalformedJSON},
		{"not JSON at all", "order placed", orders.ReasonMalformedJSON},
		{"non-UTF-8 bytes in a string", body(map[string]string{"customer_id": "\"cus-\xff\xfe\""}), orders.ReasonInvalidUTF8},
		{"non-UTF-8 byte outside strings", valid() + "\x80", orders.ReasonInvalidUTF8},
		{"latin-1 encoded body", body(map[string]string{"customer_id": "\"Zo\xeb\""}), orders.ReasonInvalidUTF8},
		{"amount as string", body(map[string]string{"amount_cents": `"1250"`}), orders.ReasonInvalidAmount},
		{"amount as float", body(map[string]string{"amount_cents": `12.5`}), orders.ReasonInvalidAmount},
		{"amount as whole float", body(map[string]string{"amount_cents": `1250.0`}), orders.ReasonInvalidAmount},
		{"amount in exponent notation", body(map[string]string{"amount_cents": `1e3`}), orders.ReasonInvalidAmount},
		{"amount overflowing int64", body(map[string]string{"amount_cents": `9223372036854775808`}), orders.ReasonInvalidAmount},
		{"amount as object", body(map[string]string{"amount_cents": `{"value":1250}`}), orders.ReasonInvalidAmount},
		{"zero amount", body(map[string]string{"amount_cents": `0`}), orders.ReasonInvalidAmount},
		{"negative zero amount", body(map[string]string{"amount_cents": `-0`}), orders.ReasonInvalidAmount},
		{"negative amount", body(map[string]string{"amount_cents": `-500`}), orders.ReasonInvalidAmount},
		{"missing event_id", body(map[string]string{"event_id": ""}), orders.ReasonMissingField},
		{"missing order_id", body(map[string]string{"order_id": ""}), orders.ReasonMissingField},
		{"missing customer_id", body(map[string]string{"customer_id": ""}), orders.ReasonMissingField},
		{"missing amount_cents", body(map[string]string{"amount_cents": ""}), orders.ReasonMissingField},
		{"missing currency", body(map[string]string{"currency": ""}), orders.ReasonMissingField},
		{"missing placed_at", body(map[string]string{"placed_at": ""}), orders.ReasonMissingField},
		{"field name in another case is not the field", strings.Replace(valid(), `"event_id"`, `"Event_ID"`, 1), orders.ReasonMissingField},
		{"empty object", "{}", orders.ReasonMissingField},
		{"JSON null", "null", orders.ReasonMissingField},
		{"null event_id", body(map[string]string{"event_id": "null"}), orders.ReasonMissingField},
		{"null order_id", body(map[string]string{"order_id": "null"}), orders.ReasonMissingField},
		{"null customer_id", body(map[string]string{"customer_id": "null"}), orders.ReasonMissingField},
		{"null amount_cents", body(map[string]string{"amount_cents": "null"}), orders.ReasonMissingField},
		{"null currency", body(map[string]string{"currency": "null"}), orders.ReasonMissingField},
		{"null placed_at", body(map[string]string{"placed_at": "null"}), orders.ReasonMissingField},
		{"empty event_id", body(map[string]string{"event_id": `""`}), orders.ReasonMissingField},
		{"empty order_id", body(map[string]string{"order_id": `""`}), orders.ReasonMissingField},
		{"blank customer_id", body(map[string]string{"customer_id": `" \t"`}), orders.ReasonMissingField},
		{"id longer than 200 bytes", body(map[string]string{"order_id": `"` + strings.Repeat("o", 201) + `"`}), orders.ReasonInvalidField},
		{"event_id as number", body(map[string]string{"event_id": `42`}), orders.ReasonWrongType},
		{"order_id as object", body(map[string]string{"order_id": `{"id":"ord-1"}`}), orders.ReasonWrongType},
		{"currency as number", body(map[string]string{"currency": `978`}), orders.ReasonWrongType},
		{"currency EURO", body(map[string]string{"currency": `"EURO"`}), orders.ReasonInvalidCurrency},
		{"currency lowercase eur", body(map[string]string{"currency": `"eur"`}), orders.ReasonInvalidCurrency},
		{"currency XXX (no currency)", body(map[string]string{"currency": `"XXX"`}), orders.ReasonInvalidCurrency},
		{"currency XAU (precious metal)", body(map[string]string{"currency": `"XAU"`}), orders.ReasonInvalidCurrency},
		{"currency empty", body(map[string]string{"currency": `""`}), orders.ReasonInvalidCurrency},
		{"currency with space", body(map[string]string{"currency": `" EUR"`}), orders.ReasonInvalidCurrency},
		{"placed_at not a time", body(map[string]string{"placed_at": `"yesterday"`}), orders.ReasonInvalidField},
		{"placed_at without zone", body(map[string]string{"placed_at": `"2024-05-01T12:30:00"`}), orders.ReasonInvalidField},
		{"placed_at with space separator", body(map[string]string{"placed_at": `"2024-05-01 12:30:00Z"`}), orders.ReasonInvalidField},
		{"placed_at date only", body(map[string]string{"placed_at": `"2024-05-01"`}), orders.ReasonInvalidField},
		{"placed_at month 13", body(map[string]string{"placed_at": `"2024-13-01T12:30:00Z"`}), orders.ReasonInvalidField},
		{"placed_at empty", body(map[string]string{"placed_at": `""`}), orders.ReasonInvalidField},
		{"placed_at zero time", body(map[string]string{"placed_at": `"0001-01-01T00:00:00Z"`}), orders.ReasonMissingField},
		// Time.UnmarshalJSON rejects a non-string with a plain error, which the
		// decoder cannot tell from a syntax error.
		{"placed_at as number", body(map[string]string{"placed_at": `1714566600`}), orders.ReasonMalformedJSON},
		{"trailing object", valid() + `{}`, orders.ReasonMalformedJSON},
		{"trailing second event", valid() + "\n" + valid(), orders.ReasonMalformedJSON},
		{"trailing garbage", valid() + `x`, orders.ReasonMalformedJSON},
		{"trailing bracket", valid() + `]`, orders.ReasonMalformedJSON},
		{"trailing comma", valid() + `,`, orders.ReasonMalformedJSON},
		{"JSON array of one event", "[" + valid() + "]", orders.ReasonWrongType},
		{"empty JSON array", "[]", orders.ReasonWrongType},
		{"JSON string", `"` + strings.ReplaceAll(valid(), `"`, `\"`) + `"`, orders.ReasonWrongType},
		{"JSON number", "42", orders.ReasonWrongType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := orders.Decode([]byte(tt.body))
			var inv *orders.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("Decode(%q) = %v, want an *InvalidError with reason %s", tt.body, err, tt.reason)
			}
			if inv.Reason != tt.reason {
				t.Errorf("Decode(%q) reason = %s (%v), want %s", tt.body, inv.Reason, err, tt.reason)
			}
			if !slices.Contains(orders.Reasons, inv.Reason) {
				t.Errorf("reason %s is missing from orders.Reasons: the consumer would dead-letter it invalid_event", inv.Reason)
			}
			if !errors.Is(err, orders.ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
		})
	}
	// Every reason of the list is one a body can be refused with.
	for _, r := range orders.Reasons {
		if !slices.ContainsFunc(tests, func(tt struct{ name, body, reason string }) bool { return tt.reason == r }) {
			t.Errorf("orders.Reasons holds %s, which no case here refuses a body with", r)
		}
	}
}

// A refused body comes back with the event as far as it was read, its
// event_id included, whatever other field is missing or invalid: the
// consumer names the message by it when it was published without a
// message_id (its dead letter, dlq replay --id).
func TestRefusedEventKeepsItsEventID(t *testing.T) {
	for name, b := range map[string]string{
		"missing customer_id":   body(map[string]string{"customer_id": ""}),
		"NUL in order_id":       body(map[string]string{"order_id": `"o\u0000x"`}),
		"amount as string":      body(map[string]string{"amount_cents": `"1250"`}),
		"currency EURO":         body(map[string]string{"currency": `"EURO"`}),
		"field in another case": body(nil, `"Currency":"EUR"`),
		"placed_at not a time":  body(map[string]string{"placed_at": `"yesterday"`}),
	} {
		o, err := orders.Decode([]byte(b))
		if err == nil || o.EventID != "evt-1" {
			t.Errorf("%s: Decode = event id %q, %v; want evt-1 and a refusal", name, o.EventID, err)
		}
	}
}

// FuzzDecode checks properties that must hold for any body: Decode never
// panics, and whatever it accepts is valid and survives a round trip through
// json.Marshal unchanged, so a consumer can re-publish an event it decoded.
// Plain `go test` runs only the seeds.
func FuzzDecode(f *testing.F) {
	v := valid()
	seeds := []string{
		v,
		body(nil, `"extra":{"nested":[1,2,3]}`),
		body(map[string]string{"placed_at": `"2024-05-01T14:30:00.123456789+02:00"`}),
		body(map[string]string{"customer_id": `"cus-\u00eb-\ud83d\ude00"`}),
		body(map[string]string{"order_id": `"<ord&1>"`}),
		v[:len(v)/2],
		"\xff" + v,
		body(map[string]string{"amount_cents": `"1250"`}),
		body(map[string]string{"amount_cents": `12.5`}),
		body(map[string]string{"amount_cents": `0`}),
		body(map[string]string{"amount_cents": `-1`}),
		body(map[string]string{"currency": `"EURO"`}),
		body(map[string]string{"currency": `"XXX"`}),
		body(map[string]string{"event_id": ""}),
		body(map[string]string{"event_id": "null"}),
		body(map[string]string{"placed_at": `"0001-01-01T00:00:00+01:00"`}),
		body(map[string]string{"placed_at": `"9999-12-31T23:59:59-01:00"`}),
		v + v,
		"[" + v + "]",
		"", "null", "{}", "[]",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := orders.Decode(b)
		if err != nil {
			if !errors.Is(err, orders.ErrInvalid) {
				t.Fatalf("Decode(%q) error %v does not match ErrInvalid", b, err)
			}
			return
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("Decode(%q) accepted %+v, which fails Validate: %v", b, o, err)
		}
		again, err := json.Marshal(o)
		if err != nil {
			t.Fatalf("Decode(%q) accepted %+v, which json.Marshal rejects: %v", b, o, err)
		}
		o2, err := orders.Decode(again)
		if err != nil {
			t.Fatalf("re-encoded %+v as %s, which Decode rejects: %v", o, again, err)
		}
		if !equal(o, o2) {
			t.Fatalf("round trip changed the event:\n  first %+v\n second %+v", o, o2)
		}
		if exact := exactFields(t, b); !equal(o, exact) {
			t.Fatalf("Decode(%q) = %+v, but its exactly named fields say %+v", b, o, exact)
		}
	})
}

// exactFields decodes only the fields of b spelled exactly as the contract
// names them. A strict decoder must agree with it: otherwise a second,
// differently spelled amount_cents could override the one every other reader
// of the message sees.
func exactFields(t *testing.T, b []byte) orders.OrderPlaced {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("Decode accepted %q, which encoding/json rejects: %v", b, err)
	}
	var parts []string
	for _, f := range validFields {
		parts = append(parts, `"`+f[0]+`":`+string(raw[f[0]]))
	}
	o, err := orders.Decode([]byte("{" + strings.Join(parts, ",") + "}"))
	if err != nil {
		t.Fatalf("Decode accepted %q, but not its exactly named fields: %v", b, err)
	}
	return o
}

// equal compares events; times by instant, since two decodes of the same
// offset yield distinct *time.Location values.
func equal(a, b orders.OrderPlaced) bool {
	ta, tb := a.PlacedAt, b.PlacedAt
	a.PlacedAt, b.PlacedAt = time.Time{}, time.Time{}
	return a == b && ta.Equal(tb)
}
