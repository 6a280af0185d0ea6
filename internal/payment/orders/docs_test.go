package orders_test

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/internal/payment/orders"
)

// docs/events.md shows an OrderPlaced and publishes it by hand: both bodies
// are valid, and the same body with "amount_cents":19.99, which the page says
// is dead-lettered invalid_amount, is refused for that reason.
func TestEventsPageBodiesDecode(t *testing.T) {
	page, err := os.ReadFile("../../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```json\n(.*?)```").FindSubmatch(page)
	published := regexp.MustCompile(`-b '([^']*)'`).FindSubmatch(page)
	if block == nil || published == nil {
		t.Fatalf("docs/events.md: no json block (%v) or no -b '…' body (%v)", block != nil, published != nil)
	}
	for _, body := range [][]byte{block[1], published[1]} {
		if _, err := orders.Decode(body); err != nil {
			t.Errorf("docs/events.md: %s: %v", body, err)
		}
	}
	float := strings.Replace(string(published[1]), `"amount_cents":1999`, `"amount_cents":19.99`, 1)
	var invalid *orders.InvalidError
	if _, err := orders.Decode([]byte(float)); !errors.As(err, &invalid) || invalid.Reason != orders.ReasonInvalidAmount || float == string(published[1]) {
		t.Errorf("the page's body with amount_cents 19.99: %v, want %s", err, orders.ReasonInvalidAmount)
	}
}
