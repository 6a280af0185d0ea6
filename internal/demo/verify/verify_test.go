package verify

import (
	"fmt"
	"testing"
)

func TestLikePrefixTakesWildcardsLiterally(t *testing.T) {
	tests := []struct{ prefix, want string }{
		{"run-", "run-%"},
		{"a_b-", `a\_b-%`},
		{"50%-", `50\%-%`},
		{`back\slash-`, `back\\slash-%`},
	}
	for _, tt := range tests {
		if got := likePrefix(tt.prefix); got != tt.want {
			t.Errorf("likePrefix(%q) = %q, want %q", tt.prefix, got, tt.want)
		}
	}
}

// Only the runs' own dead letters count as theirs: the dead-letter queue is
// shared by every run of a stack (a demo load, then a crash demo).
func TestOnlyTheRunsOwnDeadLettersCount(t *testing.T) {
	runs := []Run{{RunID: "r2", Orders: 2, Published: 4, PoisonTotal: 2}}
	f := facts{paid: map[string]string{"r2-0": "succeeded", "r2-1": "succeeded"},
		charges: map[string]int{"r2-0": 1, "r2-1": 1}, queued: map[string]int{}}
	f.dead = append(f.dead, []DeadLetter{
		{ID: "poison-r2-0-truncated-json", Reason: "malformed_json"},                                // this run's poison, by its id
		{ID: "", Reason: "missing_message_id", Attrs: map[string]string{"order_id": "r2-poison-1"}}, // no id: by its order
		{ID: "poison-r1-0-truncated-json", Reason: "malformed_json"},                                // an earlier run's
		{ID: "m-9", Reason: "order_conflict", Attrs: map[string]string{"order_id": "r1-9"}},
		{ID: "x", Reason: "malformed_json"},                     // nobody's
		{ID: "poison-r22-0-oversize", Reason: "body_too_large"}, // a run whose id starts alike
	}...)
	r := Report{DeadLettered: map[string]int{}}
	r.fill(f, runs)
	if fmt.Sprint(r.DeadLettered) != "map[malformed_json:1 missing_message_id:1]" {
		t.Errorf("dead-lettered %v, want this run's two poison messages only", r.DeadLettered)
	}
}
