package load

import (
	"encoding/json"
	"testing"
)

func TestBatchDuplicatesFollowTheirOrder(t *testing.T) {
	b := Batch{Run: "r", First: 100, Count: 1000, DuplicateRate: 0.1, Seed: 7}
	msgs := b.Messages()
	orders := map[string]bool{}
	dups := 0
	for i, m := range msgs {
		var o orderPlaced
		if err := json.Unmarshal(m.Body, &o); err != nil || o.EventID != m.ID {
			t.Fatalf("message %d: event_id %q, id %q (%v)", i, o.EventID, m.ID, err)
		}
		if orders[o.OrderID] {
			dups++
			if msgs[i-1].ID != m.ID || string(msgs[i-1].Body) != string(m.Body) {
				t.Fatalf("duplicate of %s does not follow its order", o.OrderID)
			}
		}
		orders[o.OrderID] = true
	}
	if len(orders) != 1000 || !orders["r-100"] || !orders["r-1099"] {
		t.Fatalf("%d orders, want r-100 … r-1099", len(orders))
	}
	if dups < 60 || dups > 140 {
		t.Fatalf("%d duplicates of 1000 at rate 0.1", dups)
	}
	if again := b.Messages(); len(again) != len(msgs) {
		t.Fatalf("the same seed gave %d messages, then %d", len(msgs), len(again))
	}
}
