package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/payment/gateway"
)

var request = gateway.ChargeRequest{
	IdempotencyKey: "order-1", OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR",
}

// answer serves one canned response to every request.
func answer(t *testing.T, code int, header map[string]string, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestChargeSendsTheRequest(t *testing.T) {
	var got struct {
		method, path, key, contentType string
		body                           map[string]any
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path = r.Method, r.URL.Path
		got.key, got.contentType = r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type")
		_ = json.NewDecoder(r.Body).Decode(&got.body)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1","order_id":"ord-1","status":"succeeded"}`)
	}))
	t.Cleanup(srv.Close)

	if _, err := gateway.NewClient(srv.URL+"/", time.Second, 8).Charge(context.Background(), request); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"order_id": "ord-1", "customer_id": "cust-1", "amount_cents": float64(1000), "currency": "EUR"}
	if got.method != http.MethodPost || got.path != "/v1/charges" || got.key != "order-1" || got.contentType != "application/json" {
		t.Fatalf("request = %s %s key %q content type %q", got.method, got.path, got.key, got.contentType)
	}
	if len(got.body) != len(want) {
		t.Fatalf("body = %v, want %v", got.body, want)
	}
	for k, v := range want {
		if got.body[k] != v {
			t.Fatalf("body = %v, want %v", got.body, want)
		}
	}
}

func TestChargeAnswers(t *testing.T) {
	tests := []struct {
		name   string
		header map[string]string
		body   string
		want   gateway.Charge
	}{
		{"succeeded", nil, `{"id":"ch_1","order_id":"ord-1","status":"succeeded","amount_cents":1000}`,
			gateway.Charge{ID: "ch_1", OrderID: "ord-1", Status: gateway.StatusSucceeded}},
		{"declined", nil, `{"id":"ch_2","order_id":"ord-1","status":"declined","decline_reason":"card_declined"}`,
			gateway.Charge{ID: "ch_2", OrderID: "ord-1", Status: gateway.StatusDeclined, DeclineReason: "card_declined"}},
		{"replayed", map[string]string{"Idempotent-Replayed": "true"}, `{"id":"ch_3","order_id":"ord-1","status":"succeeded"}`,
			gateway.Charge{ID: "ch_3", OrderID: "ord-1", Status: gateway.StatusSucceeded, Replayed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := answer(t, http.StatusCreated, tt.header, tt.body)
			got, err := gateway.NewClient(url, time.Second, 8).Charge(context.Background(), request)
			if err != nil || got != tt.want {
				t.Fatalf("Charge = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestChargeClassifiesStatusErrors(t *testing.T) {
	tests := []struct {
		code int
		want error
	}{
		{http.StatusBadRequest, gateway.ErrRejected},
		{http.StatusPaymentRequired, gateway.ErrRejected},
		{http.StatusUnprocessableEntity, gateway.ErrKeyReused},
		{http.StatusUnauthorized, gateway.ErrMisconfigured}, // a rotated API key
		{http.StatusForbidden, gateway.ErrMisconfigured},
		{http.StatusNotFound, gateway.ErrMisconfigured}, // a wrong GATEWAY_URL path
		{http.StatusMethodNotAllowed, gateway.ErrMisconfigured},
		{http.StatusGone, gateway.ErrMisconfigured},
		{http.StatusConflict, gateway.ErrInFlight},
		{http.StatusTooManyRequests, gateway.ErrUnavailable},
		{http.StatusRequestTimeout, gateway.ErrUnavailable},
		{http.StatusInternalServerError, gateway.ErrUnavailable},
		{http.StatusBadGateway, gateway.ErrUnavailable},
		{http.StatusServiceUnavailable, gateway.ErrUnavailable},
		{http.StatusGatewayTimeout, gateway.ErrUnavailable},
		{http.StatusFound, gateway.ErrMisconfigured},             // not followed: a redirected POST would become a GET
		{http.StatusPermanentRedirect, gateway.ErrMisconfigured}, // http:// for an https gateway
	}
	sentinels := []error{gateway.ErrUnavailable, gateway.ErrInFlight, gateway.ErrRejected, gateway.ErrKeyReused, gateway.ErrMisconfigured}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.code), func(t *testing.T) {
			body := `{"error":"nope"}`
			url := answer(t, tt.code, map[string]string{"Location": "/elsewhere"}, body)
			_, err := gateway.NewClient(url, time.Second, 8).Charge(context.Background(), request)
			for _, s := range sentinels {
				if errors.Is(err, s) != (s == tt.want) {
					t.Fatalf("errors.Is(%v, %v) = %v", err, s, !(s == tt.want))
				}
			}
			var se *gateway.StatusError
			if !errors.As(err, &se) || se.Code != tt.code || se.Body != body {
				t.Fatalf("error %v is not a StatusError{%d, %s}", err, tt.code, body)
			}
			if !strings.Contains(err.Error(), "charge order ord-1") {
				t.Fatalf("error %q does not name the order", err)
			}
		})
	}
}

func TestStatusErrorTruncatesBody(t *testing.T) {
	body := strings.Repeat("é", 1000) // 2000 bytes: the cut at 1024 falls inside no character, 1023 would
	url := answer(t, http.StatusBadRequest, nil, "x"+body)
	_, err := gateway.NewClient(url, time.Second, 8).Charge(context.Background(), request)
	var se *gateway.StatusError
	if !errors.As(err, &se) || len(se.Body) != 1023 || !strings.HasPrefix(se.Body, "xé") {
		t.Fatalf("body of %d bytes, want 1023 valid bytes", len(se.Body))
	}
}

func TestChargeTransportFailuresAreUnavailable(t *testing.T) {
	tests := []struct {
		name  string
		url   func(t *testing.T) string
		cause error // also matched, when not nil
	}{
		{"connection refused", refusedURL, syscall.ECONNREFUSED},
		{"timeout", slowURL, nil},
		{"lost response", hangUpURL, io.EOF},
		{"2xx with an undecodable body", func(t *testing.T) string { return answer(t, http.StatusCreated, nil, `{"id":`) }, nil},
		{"2xx without a status", func(t *testing.T) string {
			return answer(t, http.StatusCreated, nil, `{"id":"ch_1","status":"pending"}`)
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := gateway.NewClient(tt.url(t), 300*time.Millisecond, 8).Charge(context.Background(), request)
			if !errors.Is(err, gateway.ErrUnavailable) || errors.Is(err, gateway.ErrRejected) || errors.Is(err, gateway.ErrInFlight) {
				t.Fatalf("error %v, want only ErrUnavailable", err)
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Fatalf("error %v lost its cause %v", err, tt.cause)
			}
			var se *gateway.StatusError
			if errors.As(err, &se) {
				t.Fatalf("a transport failure is a StatusError: %v", err)
			}
		})
	}
}

func TestChargeKeepsCallerCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := gateway.NewClient(slowURL(t), time.Second, 8).Charge(ctx, request)
	if !errors.Is(err, gateway.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want ErrUnavailable and context.Canceled", err)
	}
}

// TestChargeDoesNotRetry checks that a response lost on a reused connection
// reaches the caller: net/http would resend a request with an Idempotency-Key.
func TestChargeDoesNotRetry(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ch_1","order_id":"ord-1","status":"succeeded"}`)
			return
		}
		hangUp(w)
	}))
	t.Cleanup(srv.Close)
	client := gateway.NewClient(srv.URL, time.Second, 8)
	if _, err := client.Charge(context.Background(), request); err != nil {
		t.Fatal(err)
	}
	_, err := client.Charge(context.Background(), request) // on the kept-alive connection
	if !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("error %v, want ErrUnavailable", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the gateway saw %d requests, want 2: the client retried on its own", n)
	}
}

// refusedURL is an address where nothing listens.
func refusedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr
}

// slowURL answers after the client's timeout.
func slowURL(t *testing.T) string {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	return srv.URL
}

// hangUpURL reads the request and closes the connection without a response.
func hangUpURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hangUp(w) }))
	t.Cleanup(srv.Close)
	return srv.URL
}

func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	_ = conn.Close()
}
