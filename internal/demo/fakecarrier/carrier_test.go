package fakecarrier

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest"
)

func newCarrier(t *testing.T, f Faults) (*httptest.Server, *Server, string) {
	t.Helper()
	db, url := kittest.MigratedDB(t, Migrations)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(sqlDB, f, time.Hour, kittest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv, s, url
}

func post(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/pickups", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The idempotency-key semantics, against the real database: a key is
// required; the same key and request replays the first answer (one booking);
// the same key with another request is refused; concurrent requests with one
// key book once.
func TestCarrierBooksEachKeyOnce(t *testing.T) {
	srv, _, dbURL := newCarrier(t, Faults{})
	const body = `{"order_id":"o-1","address":"1 Demo Street"}`
	if code, _ := post(t, srv.URL, "", body); code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", code)
	}
	code, first := post(t, srv.URL, "pickup:o-1", body)
	if code != http.StatusOK || !strings.Contains(first, "pu_") {
		t.Fatalf("first booking: %d %s", code, first)
	}
	if code, again := post(t, srv.URL, "pickup:o-1", body); code != http.StatusOK || again != first {
		t.Errorf("replay: %d %s, want 200 %s", code, again, first)
	}
	if code, _ := post(t, srv.URL, "pickup:o-1", `{"order_id":"o-1","address":"elsewhere"}`); code != http.StatusUnprocessableEntity {
		t.Errorf("another request under the key: %d, want 422", code)
	}
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() { codes[i], _ = post(t, srv.URL, "pickup:o-2", `{"order_id":"o-2","address":"2 Demo Street"}`) })
	}
	wg.Wait()
	for _, c := range codes {
		if c != http.StatusOK && c != http.StatusConflict {
			t.Errorf("concurrent booking answered %d", c)
		}
	}
	if n := kittest.Count(t, dbURL, `SELECT count(*) FROM pickups`); n != 2 {
		t.Errorf("%d pickups for two orders", n)
	}
}

// A lost response: the booking is stored and the connection dropped; the
// retry with the same key gets the stored answer, and nothing is booked twice.
func TestCarrierLostResponseReplays(t *testing.T) {
	srv, s, dbURL := newCarrier(t, Faults{LostResponseRate: 1})
	if code, _ := post(t, srv.URL, "pickup:o-9", `{"order_id":"o-9","address":"9 Demo Street"}`); code != 0 {
		t.Fatalf("answered %d with every response lost", code)
	}
	s.mu.Lock()
	s.faults = Faults{}
	s.mu.Unlock()
	if code, body := post(t, srv.URL, "pickup:o-9", `{"order_id":"o-9","address":"9 Demo Street"}`); code != http.StatusOK || !strings.Contains(body, "pu_") {
		t.Fatalf("retry: %d %s", code, body)
	}
	if n := kittest.Count(t, dbURL, `SELECT count(*) FROM pickups WHERE order_id = 'o-9'`); n != 1 {
		t.Errorf("%d pickups", n)
	}
}

// The fault knobs are served only when asked for, and then to a caller with
// the token alone.
func TestFaultEndpointsWantTheToken(t *testing.T) {
	_, s, _ := newCarrier(t, Faults{})
	if code := faultsCall(t, s.Handler(), ""); code != http.StatusNotFound {
		t.Errorf("GET /faults without fault endpoints = %d, want 404", code)
	}
	h := s.WithFaultEndpoints("carrier-token").Handler()
	for auth, want := range map[string]int{"": 401, "Bearer other": 401, "Bearer carrier-token": 200} {
		if code := faultsCall(t, h, auth); code != want {
			t.Errorf("GET /faults with %q = %d, want %d", auth, code, want)
		}
	}
}

func faultsCall(t *testing.T, h http.Handler, auth string) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/faults", nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}
