package fakegateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode"
	"unicode/utf8"
)

const (
	maxKeyLen    = 255
	maxIDLen     = 255
	maxBodyBytes = 64 << 10
)

// Charge statuses and the one decline reason of the decline rule.
const (
	statusSucceeded    = "succeeded"
	statusDeclined     = "declined"
	reasonCardDeclined = "card_declined"
)

// chargeRequest is the body of POST /v1/charges.
type chargeRequest struct {
	OrderID     string `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// chargeResponse is the body of a 201; its exact bytes are stored and replayed.
type chargeResponse struct {
	ID            string `json:"id"`
	OrderID       string `json:"order_id"`
	CustomerID    string `json:"customer_id"`
	AmountCents   int64  `json:"amount_cents"`
	Currency      string `json:"currency"`
	Status        string `json:"status"`
	DeclineReason string `json:"decline_reason,omitempty"`
}

// idempotencyKey returns the request's key, or an error for the 400 body.
func idempotencyKey(r *http.Request) (string, error) {
	key := r.Header.Get("Idempotency-Key")
	switch {
	case key == "":
		return "", errors.New("the Idempotency-Key header is required")
	case len(key) > maxKeyLen:
		return "", fmt.Errorf("the Idempotency-Key header must be at most %d characters", maxKeyLen)
	case !printable(key):
		// PostgreSQL text rejects invalid UTF-8 and NUL; fail with 400, not 500.
		return "", errors.New("the Idempotency-Key header must be printable UTF-8")
	}
	return key, nil
}

// decodeCharge reads and validates the body strictly: unknown fields, trailing
// data and fractional amounts are errors, as a real gateway would reject them.
func decodeCharge(w http.ResponseWriter, r *http.Request) (chargeRequest, error) {
	var req chargeRequest
	if err := decodeStrict(w, r, &req); err != nil {
		return req, err
	}
	return req, req.validate()
}

func (c chargeRequest) validate() error {
	switch {
	case !validID(c.OrderID):
		return fmt.Errorf("order_id must be 1 to %d printable characters", maxIDLen)
	case !validID(c.CustomerID):
		return fmt.Errorf("customer_id must be 1 to %d printable characters", maxIDLen)
	case c.AmountCents <= 0:
		return errors.New("amount_cents must be a positive integer of minor units")
	case !validCurrency(c.Currency):
		return errors.New("currency must be three uppercase letters, like EUR")
	}
	return nil
}

func validID(s string) bool { return s != "" && len(s) <= maxIDLen && printable(s) }

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func validCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// fingerprint identifies the request for the key-reuse check. A JSON array of
// the fields in a fixed order is canonical: encoding/json escapes strings
// deterministically, so distinct requests never share an encoding.
func (c chargeRequest) fingerprint() []byte {
	canonical, err := json.Marshal([]any{c.OrderID, c.CustomerID, c.AmountCents, c.Currency})
	if err != nil {
		panic(fmt.Sprintf("encode fingerprint: %v", err)) // strings and an int64 always encode
	}
	sum := sha256.Sum256(canonical)
	return sum[:]
}

// execute applies the decline rule of the package documentation.
func (c chargeRequest) execute(id string) chargeResponse {
	resp := chargeResponse{
		ID:          id,
		OrderID:     c.OrderID,
		CustomerID:  c.CustomerID,
		AmountCents: c.AmountCents,
		Currency:    c.Currency,
		Status:      statusSucceeded,
	}
	if c.AmountCents%100 == 2 {
		resp.Status = statusDeclined
		resp.DeclineReason = reasonCardDeclined
	}
	return resp
}

func newChargeID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails since Go 1.24
	return "ch_" + hex.EncodeToString(b)
}
