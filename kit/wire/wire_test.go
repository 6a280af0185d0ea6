package wire

import (
	"strings"
	"testing"
	"unicode/utf8"
)

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
		ReasonPermanent, ReasonInvalidReason, ReasonNoOutcome, ReasonInvalidEvent, "malformed_json", ""} {
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

// An error's text is written where PostgreSQL's text and a reader's JSON
// need valid UTF-8: no NUL, no rune cut in half at the limit.
func TestErrorTextIsValidAndBounded(t *testing.T) {
	long := strings.Repeat("a", MaxErrorText-1) + "é" + strings.Repeat("b", 10) // é straddles the limit
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"refused", "refused"},
		{"a\x00b", "ab"},
		{"bad \xff byte", "bad \uFFFD byte"},
		{long, strings.Repeat("a", MaxErrorText-1) + "…"},
	} {
		got := ErrorText(c.in)
		if got != c.want {
			t.Errorf("ErrorText(%.20q…) = %.20q… (%d bytes), want %.20q… (%d bytes)", c.in, got, len(got), c.want, len(c.want))
		}
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) {
			t.Errorf("ErrorText(%.20q…) = %.20q…: not valid UTF-8 without NUL", c.in, got)
		}
	}
}
