package fakegateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzChargeRequest: the gateway's parsing of a charge request (its
// Idempotency-Key header and its strict JSON body) never panics, and what it
// accepts is what the store can hold: a printable key and ids within their
// lengths, a positive amount, a three-letter currency.
func FuzzChargeRequest(f *testing.F) {
	f.Add("order-charge:o-1", `{"order_id":"o-1","customer_id":"c-1","amount_cents":1200,"currency":"EUR"}`)
	f.Add("order-charge:o-1", `{"order_id":"o-1","customer_id":"c-1","amount_cents":12.5,"currency":"EUR"}`)
	f.Add("", `{"order_id":"o-1","customer_id":"c-1","amount_cents":1,"currency":"EUR","x":1}`)
	f.Add("k\x00", `{"order_id":"o-1"} trailing`)
	f.Add(strings.Repeat("k", 300), `{"order_id":"\u0000","customer_id":"c","amount_cents":1,"currency":"eur"}`)
	f.Add("\xff", `[]`)
	f.Fuzz(func(t *testing.T, key, body string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", key)
		if k, err := idempotencyKey(r); err == nil && (k == "" || len(k) > maxKeyLen || !utf8.ValidString(k) || strings.ContainsRune(k, 0)) {
			t.Fatalf("accepted the key %q", k)
		}
		req, err := decodeCharge(httptest.NewRecorder(), r)
		if err != nil {
			return
		}
		// The store's rules, stated apart from the code they check: ids of 1
		// to 255 bytes of UTF-8 without control characters, a positive
		// amount, three uppercase letters.
		for _, id := range []string{req.OrderID, req.CustomerID} {
			if id == "" || len(id) > 255 || !utf8.ValidString(id) || strings.ContainsFunc(id, unicode.IsControl) {
				t.Fatalf("accepted the id %q in %+v", id, req)
			}
		}
		if req.AmountCents <= 0 || len(req.Currency) != 3 || strings.ContainsFunc(req.Currency, func(r rune) bool { return r < 'A' || r > 'Z' }) {
			t.Fatalf("accepted %+v", req)
		}
	})
}
