package faults

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func newTestCrasher() (*Crasher, *int) {
	deaths := 0
	return &Crasher{points: slices.Clone(RuntimePoints), armed: map[Point]arming{}, die: func(Point) { deaths++ }}, &deaths
}

func TestArmedOnceFiresOnce(t *testing.T) {
	c, deaths := newTestCrasher()
	if err := c.Arm(AfterCommit, 0); err != nil {
		t.Fatal(err)
	}
	c.Hit(AfterAck)
	c.Hit(AfterCommit)
	c.Hit(AfterCommit)
	if *deaths != 1 {
		t.Fatalf("died %d times, want once at the armed point", *deaths)
	}
}

func TestProbabilityOneAlwaysFires(t *testing.T) {
	c, deaths := newTestCrasher()
	if err := c.Arm(AfterInboxInsert, 1); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c.Hit(AfterInboxInsert)
	}
	c.Disarm()
	c.Hit(AfterInboxInsert)
	if *deaths != 5 {
		t.Fatalf("died %d times, want 5", *deaths)
	}
}

func TestNilCrasherNeverFires(t *testing.T) {
	var c *Crasher
	c.Hit(AfterAck) // must not panic
}

func TestHandler(t *testing.T) {
	tests := []struct {
		method, target string
		want           int
	}{
		{"POST", "/faults/crash?at=after-commit", http.StatusNoContent},
		{"POST", "/faults/crash?at=after-ack&probability=0.5", http.StatusNoContent},
		{"POST", "/faults/crash?at=after-gateway-charge", http.StatusBadRequest}, // not declared here
		{"POST", "/faults/crash?at=before-lunch", http.StatusBadRequest},
		{"POST", "/faults/crash?at=after-ack&probability=2", http.StatusBadRequest},
		{"POST", "/faults/crash?at=after-ack&probability=often", http.StatusBadRequest},
		{"DELETE", "/faults/crash", http.StatusNoContent},
		{"GET", "/faults/crash", http.StatusMethodNotAllowed},
	}
	c, _ := newTestCrasher()
	h := c.Handler("")
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.target, strings.NewReader("")))
		if rec.Code != tt.want {
			t.Errorf("%s %s = %d, want %d (%s)", tt.method, tt.target, rec.Code, tt.want, rec.Body)
		}
	}
}

// A service's own point: declared by wrapping its side effect, then armed and
// hit after a successful call only.
func TestAfterDeclaresAndFires(t *testing.T) {
	c, deaths := newTestCrasher()
	fail := false
	book := After(c, "after-carrier-book", func(_ context.Context, id string) (string, error) {
		if fail {
			return "", errors.New("carrier down")
		}
		return "label-" + id, nil
	})
	if !slices.Contains(c.Points(), "after-carrier-book") {
		t.Fatalf("points %v lack the declared one", c.Points())
	}
	if err := c.Arm("after-carrier-book", 1); err != nil {
		t.Fatal(err)
	}
	fail = true
	_, _ = book(context.Background(), "o1")
	if *deaths != 0 {
		t.Fatal("fired after a failed call")
	}
	fail = false
	if label, _ := book(context.Background(), "o1"); label != "label-o1" || *deaths != 1 {
		t.Fatalf("label %q, deaths %d; want the call's result and one death", label, *deaths)
	}
	var disabled *Crasher
	plain := func(context.Context, int) (int, error) { return 7, nil }
	if n, _ := After(disabled, "x", plain)(context.Background(), 0); n != 7 {
		t.Fatal("a disabled crasher changed the call")
	}
}

// With a token, a call without it or with another answers 401 and arms
// nothing; one with it arms. Before the token, any caller reaching the port
// armed a crash (POST answered 204).
func TestHandlerWithATokenRefusesOtherCallers(t *testing.T) {
	c, _ := newTestCrasher()
	h := c.Handler("s3cret-token")
	for _, tt := range []struct {
		name, auth string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"another token", "Bearer not-it", http.StatusUnauthorized},
		{"a prefix of it", "Bearer s3cret", http.StatusUnauthorized},
		{"not a bearer", "Basic czNjcmV0LXRva2Vu", http.StatusUnauthorized},
		{"the token", "Bearer s3cret-token", http.StatusNoContent},
		{"the scheme in lower case", "bearer s3cret-token", http.StatusNoContent}, // RFC 7235: the scheme is case-insensitive
		{"the scheme in upper case", "BEARER s3cret-token", http.StatusNoContent},
		{"the token in another case", "Bearer S3CRET-TOKEN", http.StatusUnauthorized},
		{"no space", "Bearers3cret-token", http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c.Disarm()
			req := httptest.NewRequest("POST", "/faults/crash?at=after-commit", nil)
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("= %d, want %d (%s)", rec.Code, tt.want, rec.Body)
			}
			if armed := len(c.Armed()) > 0; armed != (tt.want == http.StatusNoContent) {
				t.Errorf("armed %v after %d", c.Armed(), rec.Code)
			}
		})
	}
}
