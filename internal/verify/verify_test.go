package verify

import "testing"

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
