package fakegateway

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestFaultEndpointsAre404WhenDisabled(t *testing.T) {
	e := newEnv(t, Options{FaultsEnabled: false})
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		if got := e.do(t, method, "/faults", "", `{"error_rate":1}`); got.code != http.StatusNotFound {
			t.Fatalf("%s /faults = %d, want 404", method, got.code)
		}
	}
	if f := e.srv.Faults(); f != (Faults{}) {
		t.Fatalf("faults changed to %+v", f)
	}
}

// With a token, the fault knobs answer 401 to a caller without it and stay
// as they were.
func TestFaultEndpointsRequireTheToken(t *testing.T) {
	e := newEnvWith(t, memoryStore, Options{FaultsEnabled: true, FaultsToken: "gw-token"})
	h := e.srv.Handler()
	for _, auth := range []string{"", "Bearer other", "gw-token"} {
		req := httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(`{"error_rate":1}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("POST /faults with %q = %d, want 401", auth, rec.Code)
		}
	}
	if f := e.srv.Faults(); f != (Faults{}) {
		t.Fatalf("faults changed to %+v without the token", f)
	}
	req := httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(`{"error_rate":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer gw-token")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNoContent || e.srv.Faults().ErrorRate != 1 {
		t.Fatalf("POST /faults with the token = %d, faults %+v", rec.Code, e.srv.Faults())
	}
}

func TestFaultEndpoints(t *testing.T) {
	e := newEnv(t, Options{FaultsEnabled: true})
	if got := e.do(t, http.MethodGet, "/faults", "", ""); got.code != http.StatusOK ||
		string(got.body) != `{"error_rate":0,"lost_response_rate":0,"latency":"0s","key_ttl":"0s"}` {
		t.Fatalf("GET /faults = %d %s", got.code, got.body)
	}
	tests := []struct {
		name     string
		body     string
		wantCode int
		want     Faults // the knobs afterwards
	}{
		{"all knobs", `{"error_rate":0.2,"lost_response_rate":0.1,"latency":"200ms"}`, 204,
			Faults{ErrorRate: 0.2, LostResponseRate: 0.1, Latency: 200 * time.Millisecond}},
		{"one knob keeps the others", `{"error_rate":0.5}`, 204,
			Faults{ErrorRate: 0.5, LostResponseRate: 0.1, Latency: 200 * time.Millisecond}},
		{"key lifetime", `{"key_ttl":"24h"}`, 204,
			Faults{ErrorRate: 0.5, LostResponseRate: 0.1, Latency: 200 * time.Millisecond, KeyTTL: 24 * time.Hour}},
		{"zeros are values", `{"error_rate":0,"lost_response_rate":0,"latency":"0s","key_ttl":"0s"}`, 204, Faults{}},
		{"negative key lifetime", `{"key_ttl":"-1s"}`, 400, Faults{}},
		{"rate above 1", `{"error_rate":1.5}`, 400, Faults{}},
		{"negative rate", `{"lost_response_rate":-0.1}`, 400, Faults{}},
		{"latency above 1m", `{"latency":"2m"}`, 400, Faults{}},
		{"negative latency", `{"latency":"-1s"}`, 400, Faults{}},
		{"latency without unit", `{"latency":"200"}`, 400, Faults{}},
		{"unknown knob", `{"crash":true}`, 400, Faults{}},
		{"invalid change keeps all", `{"error_rate":0.3,"latency":"1h"}`, 400, Faults{}},
		{"not JSON", `error_rate=1`, 400, Faults{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := e.do(t, http.MethodPost, "/faults", "", tt.body); got.code != tt.wantCode {
				t.Fatalf("POST /faults = %d %s, want %d", got.code, got.body, tt.wantCode)
			}
			if f := e.srv.Faults(); f != tt.want {
				t.Fatalf("faults = %+v, want %+v", f, tt.want)
			}
		})
	}
	e.do(t, http.MethodPost, "/faults", "", `{"error_rate":0.5,"lost_response_rate":0.5,"latency":"1s","key_ttl":"1h"}`)
	if got := e.do(t, http.MethodDelete, "/faults", "", ""); got.code != http.StatusNoContent {
		t.Fatalf("DELETE /faults = %d %s, want 204", got.code, got.body)
	}
	if f := e.srv.Faults(); f != (Faults{KeyTTL: time.Hour}) {
		t.Fatalf("after DELETE /faults the knobs are %+v, want every fault off and the key lifetime kept", f)
	}
	e.do(t, http.MethodPost, "/faults", "", `{"key_ttl":"0s"}`)
	e.do(t, http.MethodPost, "/faults", "", `{"error_rate":1,"latency":"1.5s"}`)
	if got := e.do(t, http.MethodGet, "/faults", "", ""); string(got.body) != `{"error_rate":1,"lost_response_rate":0,"latency":"1.5s","key_ttl":"0s"}` {
		t.Fatalf("GET /faults = %s", got.body)
	}
	if got := e.post(t, "key-1", chargeJSON("ord-1", 1000)); got.code != http.StatusServiceUnavailable {
		t.Fatalf("charge with error_rate 1 set over HTTP = %d, want 503", got.code)
	}
}

func TestFaultsValidate(t *testing.T) {
	tests := []struct {
		name string
		f    Faults
		ok   bool
	}{
		{"zero", Faults{}, true},
		{"maxima", Faults{ErrorRate: 1, LostResponseRate: 1, Latency: time.Minute}, true},
		{"error rate above 1", Faults{ErrorRate: 1.01}, false},
		{"error rate NaN", Faults{ErrorRate: math.NaN()}, false},
		{"lost rate negative", Faults{LostResponseRate: -0.5}, false},
		{"latency negative", Faults{Latency: -time.Millisecond}, false},
		{"latency above 1m", Faults{Latency: time.Minute + 1}, false},
		{"key lifetime", Faults{KeyTTL: 24 * time.Hour}, true},
		{"key lifetime negative", Faults{KeyTTL: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.f.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tt.f, err, tt.ok)
			}
		})
	}
}

func TestNewServerRejectsBadSettings(t *testing.T) {
	log := discardLogger()
	if _, err := NewServerWithStore(NewMemoryStore(), prometheus.NewRegistry(), log, Faults{ErrorRate: 2}, Options{InFlightTakeover: time.Second}); err == nil {
		t.Fatal("NewServer accepted an error rate of 2")
	}
	if _, err := NewServer(nil, prometheus.NewRegistry(), log, Faults{}, Options{}); err == nil {
		t.Fatal("NewServer accepted a zero takeover age")
	}
	reg := prometheus.NewRegistry()
	if _, err := NewServer(nil, reg, log, Faults{}, Options{InFlightTakeover: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(nil, reg, log, Faults{}, Options{InFlightTakeover: time.Second}); err == nil {
		t.Fatal("a second Server registered the same metrics on one registry")
	}
}

func TestHealthz(t *testing.T) {
	mem := newEnvWith(t, memoryStore, Options{})
	if got := mem.do(t, http.MethodGet, "/healthz", "", ""); got.code != http.StatusOK {
		t.Fatalf("healthz of the memory store = %d %s, want 200", got.code, got.body)
	}
	e := newEnv(t, Options{})
	if got := e.do(t, http.MethodGet, "/healthz", "", ""); got.code != http.StatusOK || string(got.body) != `{"status":"ok"}` {
		t.Fatalf("healthz = %d %s, want 200 {\"status\":\"ok\"}", got.code, got.body)
	}
	sqlDB, err := e.probe.(postgresProbe).db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlDB.Close(); err != nil {
		t.Fatal(err)
	}
	if got := e.do(t, http.MethodGet, "/healthz", "", ""); got.code != http.StatusServiceUnavailable {
		t.Fatalf("healthz with the database closed = %d %s, want 503", got.code, got.body)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		e.post(t, "key-1", chargeJSON("ord-1", 1000))
		e.post(t, "key-1", chargeJSON("ord-1", 1000))
		e.post(t, "key-2", chargeJSON("ord-2", 1002))
		e.post(t, "", chargeJSON("ord-3", 1000))
		got := e.do(t, http.MethodGet, "/metrics", "", "")
		if got.code != http.StatusOK {
			t.Fatalf("metrics = %d", got.code)
		}
		for _, line := range []string{
			`gateway_requests_total{result="created"} 2`,
			`gateway_requests_total{result="replayed"} 1`,
			`gateway_requests_total{result="bad_request"} 1`,
			`gateway_requests_total{result="lost_response"} 0`,
			`gateway_charges_total{status="succeeded"} 1`,
			`gateway_charges_total{status="declined"} 1`,
		} {
			if !strings.Contains(string(got.body), line+"\n") {
				t.Errorf("metrics lack %q", line)
			}
		}
	})
}

func TestUnknownRoutes(t *testing.T) {
	e := newEnv(t, Options{})
	if got := e.do(t, http.MethodGet, "/v1/charges", "k", ""); got.code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/charges = %d, want 405", got.code)
	}
	if got := e.do(t, http.MethodGet, "/nope", "", ""); got.code != http.StatusNotFound {
		t.Fatalf("GET /nope = %d, want 404", got.code)
	}
}
