// Package orders defines the OrderPlaced event, its strict decoder and its
// validation rules, shared by the producer and the payment consumer.
package orders

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// OrderPlaced is published when a customer places an order. Money is an integer
// amount of the currency's minor units; never a float.
type OrderPlaced struct {
	EventID     string    `json:"event_id"`
	OrderID     string    `json:"order_id"`
	CustomerID  string    `json:"customer_id"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	PlacedAt    time.Time `json:"placed_at"`
	// ShippingAddress is optional: where a paid order is shipped (the
	// payment service passes it on in OrderPaid).
	ShippingAddress string `json:"shipping_address,omitempty"`
}

// maxAddressLen bounds a shipping address.
const maxAddressLen = 500

// Reasons a body is rejected. They travel as the dead-letter reason header, so
// they are stable, short and machine-readable.
const (
	ReasonInvalidUTF8     = "invalid_utf8"
	ReasonMalformedJSON   = "malformed_json"
	ReasonWrongType       = "wrong_type"
	ReasonMissingField    = "missing_field"
	ReasonInvalidAmount   = "invalid_amount"
	ReasonInvalidCurrency = "invalid_currency"
	ReasonInvalidField    = "invalid_field"
)

// Reasons are all of the above: a consumer declares each as its dead-letter
// reason at start.
var Reasons = []string{ReasonInvalidUTF8, ReasonMalformedJSON, ReasonWrongType, ReasonMissingField,
	ReasonInvalidAmount, ReasonInvalidCurrency, ReasonInvalidField}

// ErrInvalid is matched by every decoding or validation failure.
var ErrInvalid = errors.New("invalid OrderPlaced")

// InvalidError says why a body is not a valid OrderPlaced.
type InvalidError struct {
	Reason string
	Detail string
}

func (e *InvalidError) Error() string { return "invalid OrderPlaced: " + e.Reason + ": " + e.Detail }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(reason, format string, args ...any) error {
	return &InvalidError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

const maxIDLen = 200

// fields are the required keys of the contract, spelled exactly.
var fields = []string{"event_id", "order_id", "customer_id", "amount_cents", "currency", "placed_at"}

// Decode parses and validates body. Unknown fields are allowed so that producers
// can add fields without breaking this consumer; everything else is strict.
// A body it refuses comes back with the event as far as it was read, its
// event_id first: the consumer names the message by it (the dead letter of a
// message published without a message_id).
func Decode(body []byte) (OrderPlaced, error) {
	var o OrderPlaced
	if !utf8.Valid(body) {
		// encoding/json would silently replace invalid bytes with U+FFFD.
		return o, invalid(ReasonInvalidUTF8, "body is not valid UTF-8")
	}
	var raw map[string]json.RawMessage
	if err := decodeOne(body, &raw); err != nil {
		return o, err
	}
	if id, ok := raw["event_id"]; ok {
		_ = json.Unmarshal(id, &o.EventID) // not a string: refused below, and left empty
	}
	for _, f := range fields {
		if v, ok := raw[f]; !ok || string(v) == "null" {
			return o, invalid(ReasonMissingField, "%s is missing", f)
		}
	}
	// encoding/json matches keys case-insensitively: "Amount_Cents" would
	// silently override "amount_cents" for us but not for a stricter reader.
	for key := range raw {
		for _, f := range fields {
			if key != f && strings.EqualFold(key, f) {
				return o, invalid(ReasonInvalidField, "field %q must be spelled %q", key, f)
			}
		}
	}
	if err := decodeOne(body, &o); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// decodeOne decodes exactly one JSON value, rejecting trailing data.
func decodeOne(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		var timeErr *time.ParseError
		switch {
		case errors.As(err, &typeErr) && typeErr.Field == "amount_cents":
			return invalid(ReasonInvalidAmount, "amount_cents must be an integer of minor units, got a JSON %s", typeErr.Value)
		case errors.As(err, &typeErr):
			return invalid(ReasonWrongType, "%s must not be a JSON %s", typeErr.Field, typeErr.Value)
		case errors.As(err, &timeErr):
			return invalid(ReasonInvalidField, "placed_at must be RFC 3339: %v", err)
		default:
			return invalid(ReasonMalformedJSON, "%v", err)
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid(ReasonMalformedJSON, "trailing data after the JSON object")
	}
	return nil
}

// Validate checks the business rules of an event.
func (o OrderPlaced) Validate() error {
	for name, v := range map[string]string{"event_id": o.EventID, "order_id": o.OrderID, "customer_id": o.CustomerID} {
		if strings.TrimSpace(v) == "" {
			return invalid(ReasonMissingField, "%s is empty", name)
		}
		if len(v) > maxIDLen {
			return invalid(ReasonInvalidField, "%s is longer than %d bytes", name, maxIDLen)
		}
		// Valid JSON and UTF-8, but PostgreSQL text refuses NUL, and no id
		// of ours holds a control character: invalid input, not a failure
		// to retry.
		if strings.ContainsFunc(v, unicode.IsControl) {
			return invalid(ReasonInvalidField, "%s holds a control character", name)
		}
	}
	if o.AmountCents <= 0 {
		return invalid(ReasonInvalidAmount, "amount_cents must be positive, got %d", o.AmountCents)
	}
	if !IsCurrency(o.Currency) {
		return invalid(ReasonInvalidCurrency, "currency %q is not an ISO 4217 code", o.Currency)
	}
	if o.PlacedAt.IsZero() {
		return invalid(ReasonMissingField, "placed_at is zero")
	}
	if len(o.ShippingAddress) > maxAddressLen || strings.ContainsFunc(o.ShippingAddress, unicode.IsControl) {
		return invalid(ReasonInvalidField, "shipping_address is longer than %d bytes or holds a control character", maxAddressLen)
	}
	return nil
}
