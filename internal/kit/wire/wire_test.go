package wire

import "testing"

// Only a reason given at the door (before the handler ran) tells that a dead
// letter cannot have called out; every other reason may follow a call.
func TestRefusedBeforeRunKnowsTheDoorsReasons(t *testing.T) {
	for _, r := range []string{ReasonMissingID, ReasonInvalidID, ReasonBodyTooLarge, ReasonUnsupportedContent,
		ReasonInvalidOrderingKey, ReasonIngestFailed, ReasonHeadersTooLarge} {
		if !RefusedBeforeRun(r) {
			t.Errorf("RefusedBeforeRun(%q) = false, want true", r)
		}
	}
	for _, r := range []string{ReasonRetriesExhausted, ReasonPayloadMismatch, ReasonHeldTooOften, ReasonKeyExpired,
		ReasonPermanent, ReasonInvalidReason, ReasonNoOutcome, "malformed_json", ""} {
		if RefusedBeforeRun(r) {
			t.Errorf("RefusedBeforeRun(%q) = true, want false", r)
		}
	}
}

// The mark counts unless it is the boolean false: a producer that sets it
// only makes the key-expiry guard stricter.
func TestMarkedAsRun(t *testing.T) {
	for _, c := range []struct {
		headers map[string]any
		want    bool
	}{
		{nil, false},
		{map[string]any{}, false},
		{map[string]any{HeaderMayHaveRun: false}, false},
		{map[string]any{HeaderMayHaveRun: true}, true},
		{map[string]any{HeaderMayHaveRun: "yes"}, true},
		{map[string]any{HeaderAttempt: int32(2)}, false},
	} {
		if got := MarkedAsRun(c.headers); got != c.want {
			t.Errorf("MarkedAsRun(%v) = %v, want %v", c.headers, got, c.want)
		}
	}
}
