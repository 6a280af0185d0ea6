package rabbit

import (
	"encoding/json"
	"testing"
)

// FuzzHeadersFromJSON: headers read back from the jsonb column (the
// buffered inbox's stored messages, the outbox's rows) never panic the
// reader, and what it reads renders again (HeadersJSON) as JSON that reads
// back to the same rendering: a stored message can be published, stored and
// published again.
func FuzzHeadersFromJSON(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"x-attempt":3,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		`{"x-death":[{"queue":"q.retry.1s","count":2,"time":"2026-12-01T00:00:00Z"}]}`,
		`{"n":1.5,"big":12345678901234567890,"neg":-1,"nested":{"a":[true,null,"s"]}}`,
		`{"k":"\u0000"}`, `[]`, `null`, ``, `{"a":`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, err := HeadersFromJSON(raw)
		if err != nil {
			return
		}
		once := HeadersJSON(h)
		if !json.Valid([]byte(once)) {
			t.Fatalf("HeadersJSON(%v) = %q, not JSON", h, once)
		}
		h2, err := HeadersFromJSON([]byte(once))
		if err != nil {
			t.Fatalf("its own rendering %q does not read back: %v", once, err)
		}
		if twice := HeadersJSON(h2); twice != once {
			t.Fatalf("rendering changed on a round trip: %q, then %q", once, twice)
		}
	})
}
