package fakegateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/payment/gateway"
	"github.com/inbox-template/payment-service/kit/kittest"
)

func TestChargeRejectsBadRequests(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		valid := chargeJSON("ord-1", 1000)
		tests := []struct {
			name string
			key  string
			body string
		}{
			{"missing key", "", valid},
			{"key too long", strings.Repeat("k", 256), valid},
			{"key not UTF-8", "key-\xff", valid},
			{"not JSON", "k-json", `{"order_id":`},
			{"empty body", "k-empty", ``},
			{"trailing data", "k-trailing", valid + `{}`},
			{"unknown field", "k-unknown", `{"order_id":"o","customer_id":"c","amount_cents":1,"currency":"EUR","card":"4242"}`},
			{"missing order_id", "k-order", `{"customer_id":"c","amount_cents":1,"currency":"EUR"}`},
			{"missing customer_id", "k-customer", `{"order_id":"o","amount_cents":1,"currency":"EUR"}`},
			{"zero amount", "k-zero", `{"order_id":"o","customer_id":"c","amount_cents":0,"currency":"EUR"}`},
			{"negative amount", "k-negative", `{"order_id":"o","customer_id":"c","amount_cents":-5,"currency":"EUR"}`},
			{"fractional amount", "k-float", `{"order_id":"o","customer_id":"c","amount_cents":10.5,"currency":"EUR"}`},
			{"amount as string", "k-string", `{"order_id":"o","customer_id":"c","amount_cents":"10","currency":"EUR"}`},
			{"lowercase currency", "k-lower", `{"order_id":"o","customer_id":"c","amount_cents":1,"currency":"eur"}`},
			{"long currency", "k-long", `{"order_id":"o","customer_id":"c","amount_cents":1,"currency":"EURO"}`},
			{"order_id with NUL", "k-nul", `{"order_id":"o\u0000","customer_id":"c","amount_cents":1,"currency":"EUR"}`},
			{"order_id too long", "k-order-long", chargeJSON(strings.Repeat("o", 256), 1)},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got := e.post(t, tt.key, tt.body)
				if got.code != http.StatusBadRequest {
					t.Fatalf("code = %d, want 400; body %s", got.code, got.body)
				}
				var body struct{ Error string }
				if err := json.Unmarshal(got.body, &body); err != nil || body.Error == "" {
					t.Fatalf("body %s is not {\"error\":...}: %v", got.body, err)
				}
			})
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("bad requests stored %d rows", n)
		}
		if got := e.counter(t, "gateway_requests_total", "result", resultBadRequest); got != float64(len(tests)) {
			t.Fatalf("bad_request counter = %v, want %d", got, len(tests))
		}
	})
}

func TestChargeNewKeyCreatesOneCompletedRow(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		got := e.post(t, "key-new", chargeJSON("ord-1", 1000))
		if got.code != http.StatusCreated {
			t.Fatalf("code = %d, want 201; body %s", got.code, got.body)
		}
		if got.replayed != "" {
			t.Fatalf("a first answer has Idempotent-Replayed %q", got.replayed)
		}
		var ch chargeResponse
		if err := json.Unmarshal(got.body, &ch); err != nil {
			t.Fatal(err)
		}
		want := chargeResponse{ID: ch.ID, OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR", Status: "succeeded"}
		if ch != want || !strings.HasPrefix(ch.ID, "ch_") || len(ch.ID) != len("ch_")+24 {
			t.Fatalf("charge = %+v, want %+v with an id ch_<24 hex>", ch, want)
		}
		if bytes.Contains(got.body, []byte("decline_reason")) {
			t.Fatalf("a successful charge carries decline_reason: %s", got.body)
		}
		r := e.row(t, "key-new")
		if r.ID != ch.ID || r.State != stateCompleted || *r.Status != statusSucceeded || r.DeclineReason != nil ||
			*r.ResponseCode != http.StatusCreated || !bytes.Equal(r.ResponseBody, got.body) || r.Replays != 0 || r.CompletedAt == nil {
			t.Fatalf("row = %+v, want the completed charge with the response %s", r, got.body)
		}
		if n := e.count(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

func TestChargeSameKeySameRequestReplays(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		first := e.post(t, "key-replay", chargeJSON("ord-1", 1000))
		if first.code != http.StatusCreated {
			t.Fatalf("first code = %d; body %s", first.code, first.body)
		}
		// The fingerprint covers the values, not the bytes: field order and spacing may change.
		reordered := `{ "currency":"EUR", "amount_cents":1000, "customer_id":"cust-1", "order_id":"ord-1" }`
		for i, body := range []string{chargeJSON("ord-1", 1000), reordered} {
			got := e.post(t, "key-replay", body)
			if got.code != http.StatusCreated || got.replayed != "true" || !bytes.Equal(got.body, first.body) {
				t.Fatalf("replay %d: code %d, Idempotent-Replayed %q, body %s; want 201, true, %s",
					i+1, got.code, got.replayed, got.body, first.body)
			}
			if r := e.row(t, "key-replay"); r.Replays != i+1 {
				t.Fatalf("replays = %d after %d replays", r.Replays, i+1)
			}
		}
		if n := e.count(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
		if got := e.counter(t, "gateway_charges_total", "status", statusSucceeded); got != 1 {
			t.Fatalf("charges executed = %v, want 1", got)
		}
	})
}

func TestChargeSameKeyDifferentRequestIs422(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		if got := e.post(t, "key-reuse", chargeJSON("ord-1", 1000)); got.code != http.StatusCreated {
			t.Fatalf("first code = %d; body %s", got.code, got.body)
		}
		tests := []struct {
			name string
			body string
		}{
			{"other order", chargeJSON("ord-2", 1000)},
			{"other amount", chargeJSON("ord-1", 1001)},
			{"other customer", `{"order_id":"ord-1","customer_id":"cust-2","amount_cents":1000,"currency":"EUR"}`},
			{"other currency", `{"order_id":"ord-1","customer_id":"cust-1","amount_cents":1000,"currency":"USD"}`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got := e.post(t, "key-reuse", tt.body)
				want := `{"error":"idempotency key reused with a different request"}`
				if got.code != http.StatusUnprocessableEntity || string(got.body) != want {
					t.Fatalf("got %d %s, want 422 %s", got.code, got.body, want)
				}
			})
		}
		if r := e.row(t, "key-reuse"); r.Replays != 0 {
			t.Fatalf("a mismatch counted as a replay: %d", r.Replays)
		}
		if n := e.count(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

func TestChargeWhileFirstInFlightIs409(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		// Long enough that the second request arrives in time even on a loaded machine.
		e.setFaults(t, Faults{Latency: 5 * time.Second})
		body := chargeJSON("ord-1", 1000)
		type result struct {
			reply
			err error
		}
		firstDone := make(chan result, 1)
		go func() {
			r, err := e.send(http.MethodPost, "/v1/charges", "key-busy", body)
			firstDone <- result{r, err}
		}()
		kittest.Eventually(t, 5*time.Second, "the first request's in-flight row", func() (bool, error) {
			return e.count(t) == 1, nil
		})

		got := e.post(t, "key-busy", body)
		want := `{"error":"a request with this idempotency key is in flight"}`
		if got.code != http.StatusConflict || string(got.body) != want {
			t.Fatalf("second request: %d %s, want 409 %s", got.code, got.body, want)
		}
		first := <-firstDone
		if first.err != nil || first.code != http.StatusCreated {
			t.Fatalf("first request: %d %s (%v)", first.code, first.body, first.err)
		}
		e.setFaults(t, Faults{})
		if again := e.post(t, "key-busy", body); again.replayed != "true" || !bytes.Equal(again.body, first.body) {
			t.Fatalf("after completion: %d %q %s, want the replay of %s", again.code, again.replayed, again.body, first.body)
		}
	})
}

func TestChargeTakesOverAbandonedInFlightKey(t *testing.T) {
	// The row's age is set directly, so the test does not depend on timing.
	eachStore(t, Options{InFlightTakeover: time.Minute}, func(t *testing.T, e *env) {
		req := chargeRequest{OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR"}
		body := chargeJSON("ord-1", 1000)
		// A gateway that crashed right after its claim leaves exactly this claim behind.
		if _, ok, err := e.srv.store.claim(context.Background(), "ch_crashed", "key-crashed", req.fingerprint(), req); err != nil || !ok {
			t.Fatalf("claim = %v, %v", ok, err)
		}
		if got := e.post(t, "key-crashed", body); got.code != http.StatusConflict {
			t.Fatalf("young in-flight row: %d %s, want 409", got.code, got.body)
		}
		if got := e.post(t, "key-crashed", chargeJSON("ord-2", 1000)); got.code != http.StatusUnprocessableEntity {
			t.Fatalf("other request on the key: %d %s, want 422", got.code, got.body)
		}
		e.probe.age(t, "key-crashed", 61*time.Second)

		// The latency keeps the taker in flight while the others arrive.
		e.setFaults(t, Faults{Latency: 300 * time.Millisecond})
		replies := postConcurrently(t, e, 20, "key-crashed", body)
		assertOneCharge(t, e, replies, "key-crashed")
		if r := e.row(t, "key-crashed"); r.ID != "ch_crashed" {
			t.Fatalf("the takeover made charge %s, want the abandoned row's ch_crashed", r.ID)
		}
		if got := e.counter(t, "gateway_in_flight_takeovers_total", "", ""); got != 1 {
			t.Fatalf("takeovers = %v, want exactly 1", got)
		}
		if got := e.counter(t, "gateway_charges_total", "status", statusSucceeded); got != 1 {
			t.Fatalf("charges executed = %v, want 1", got)
		}
	})
}

// TestTakeOverOnlyOneWins races two takers that read the same stale row, which
// the HTTP test above cannot force.
func TestTakeOverOnlyOneWins(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		ctx := context.Background()
		req := chargeRequest{OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR"}
		if _, ok, err := e.srv.store.claim(ctx, "ch_1", "key-1", req.fingerprint(), req); err != nil || !ok {
			t.Fatalf("claim = %v, %v", ok, err)
		}
		var seen [2]existing
		for i := range seen {
			got, err := e.srv.store.lookup(ctx, "key-1", time.Nanosecond, 0)
			if err != nil || !got.stale {
				t.Fatalf("lookup = %+v, %v; want a stale row", got, err)
			}
			seen[i] = got
		}
		first, won, err := e.srv.store.takeOver(ctx, seen[0])
		if err != nil || !won || !first.at.After(seen[0].createdAt) {
			t.Fatalf("first taker: %+v won=%v err=%v", first, won, err)
		}
		if _, won, err := e.srv.store.takeOver(ctx, seen[1]); err != nil || won {
			t.Fatalf("second taker with the same snapshot: won=%v err=%v, want lost", won, err)
		}
		// The first claim's owner, presumed dead, must not release the taker's claim.
		if err := e.srv.store.release(ctx, claim{id: "ch_1", at: seen[0].createdAt}); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t); n != 1 {
			t.Fatalf("the old owner released the taker's claim: %d rows", n)
		}
		if err := e.srv.store.release(ctx, first); err != nil {
			t.Fatal(err)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("the taker could not release its claim: %d rows", n)
		}
	})
}

func TestChargeDeclineRule(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		tests := []struct {
			amount       int64
			wantStatus   string
			wantDeclined bool
		}{
			{2, statusDeclined, true},
			{102, statusDeclined, true},
			{1002, statusDeclined, true},
			{1000, statusSucceeded, false},
			{1001, statusSucceeded, false},
			{1012, statusSucceeded, false},
			{1020, statusSucceeded, false},
			{1200, statusSucceeded, false},
		}
		for _, tt := range tests {
			t.Run(strconv.FormatInt(tt.amount, 10), func(t *testing.T) {
				key := "key-" + strconv.FormatInt(tt.amount, 10)
				got := e.post(t, key, chargeJSON("ord-"+strconv.FormatInt(tt.amount, 10), tt.amount))
				var ch chargeResponse
				if err := json.Unmarshal(got.body, &ch); err != nil || got.code != http.StatusCreated {
					t.Fatalf("got %d %s (%v)", got.code, got.body, err)
				}
				wantReason := ""
				if tt.wantDeclined {
					wantReason = reasonCardDeclined
				}
				if ch.Status != tt.wantStatus || ch.DeclineReason != wantReason {
					t.Fatalf("status %q reason %q, want %q %q", ch.Status, ch.DeclineReason, tt.wantStatus, wantReason)
				}
				r := e.row(t, key)
				if *r.Status != tt.wantStatus || (r.DeclineReason != nil) != tt.wantDeclined {
					t.Fatalf("row status %v reason %v, want %q declined=%v", *r.Status, r.DeclineReason, tt.wantStatus, tt.wantDeclined)
				}
			})
		}
	})
}

func TestChargeErrorRateAnswers503WithoutRow(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		e.setFaults(t, Faults{ErrorRate: 1})
		got := e.post(t, "key-503", chargeJSON("ord-1", 1000))
		if got.code != http.StatusServiceUnavailable {
			t.Fatalf("code = %d, want 503; body %s", got.code, got.body)
		}
		if n := e.count(t); n != 0 {
			t.Fatalf("an injected error stored %d rows", n)
		}
		_, err := gateway.NewClient(e.url, 5*time.Second, 8).Charge(context.Background(), gateway.ChargeRequest{
			IdempotencyKey: "key-503", OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR",
		})
		if !errors.Is(err, gateway.ErrUnavailable) {
			t.Fatalf("client error = %v, want ErrUnavailable", err)
		}
	})
}

func TestChargeLostResponseIsStoredAndReplayed(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		e.setFaults(t, Faults{LostResponseRate: 1})
		client := gateway.NewClient(e.url, 5*time.Second, 8)
		req := gateway.ChargeRequest{IdempotencyKey: "key-lost", OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR"}

		_, err := client.Charge(context.Background(), req)
		if !errors.Is(err, gateway.ErrUnavailable) {
			t.Fatalf("lost response: error %v, want ErrUnavailable", err)
		}
		r := e.row(t, "key-lost")
		if r.State != stateCompleted || *r.Status != statusSucceeded {
			t.Fatalf("row after a lost response = %+v, want completed and succeeded", r)
		}

		// The knob stays at 1: a replay is not an execution and is never dropped.
		ch, err := client.Charge(context.Background(), req)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		want := gateway.Charge{ID: r.ID, OrderID: "ord-1", Status: gateway.StatusSucceeded, Replayed: true}
		if ch != want {
			t.Fatalf("retry = %+v, want %+v", ch, want)
		}
		if n := e.count(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
		if got := e.counter(t, "gateway_requests_total", "result", resultLostResponse); got != 1 {
			t.Fatalf("lost_response counter = %v, want 1", got)
		}
	})
}

func TestChargeConcurrentSameKeyChargesOnce(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		// The latency keeps the first request in flight while the others arrive.
		e.setFaults(t, Faults{Latency: 100 * time.Millisecond})
		replies := postConcurrently(t, e, 50, "key-storm", chargeJSON("ord-1", 1000))
		assertOneCharge(t, e, replies, "key-storm")
		if got := e.counter(t, "gateway_charges_total", "status", statusSucceeded); got != 1 {
			t.Fatalf("charges executed = %v, want 1", got)
		}
	})
}

// TestChargeLatencyAppliesToEveryAnswer checks that the latency fault is the
// network time of every charge request, not only of the new charges. Only the
// lower bound is checked: a loaded machine may always take longer.
func TestChargeLatencyAppliesToEveryAnswer(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		const latency = 300 * time.Millisecond
		tests := []struct {
			name     string
			faults   Faults
			key      string
			body     string
			wantCode int
		}{
			{"new charge", Faults{Latency: latency}, "key-1", chargeJSON("ord-1", 1000), http.StatusCreated},
			{"replay", Faults{Latency: latency}, "key-1", chargeJSON("ord-1", 1000), http.StatusCreated},
			{"other request on the key", Faults{Latency: latency}, "key-1", chargeJSON("ord-2", 1000), http.StatusUnprocessableEntity},
			{"no key", Faults{Latency: latency}, "", chargeJSON("ord-3", 1000), http.StatusBadRequest},
			{"injected error", Faults{Latency: latency, ErrorRate: 1}, "key-4", chargeJSON("ord-4", 1000), http.StatusServiceUnavailable},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e.setFaults(t, tt.faults)
				start := time.Now()
				got := e.post(t, tt.key, tt.body)
				if took := time.Since(start); got.code != tt.wantCode || took < latency {
					t.Fatalf("got %d after %s, want %d after at least %s; body %s", got.code, took, tt.wantCode, latency, got.body)
				}
			})
		}
	})
}

// TestChargeLatencyLongerThanStoreTimeout guards against one deadline for the
// whole request, which a latency above it would exhaust before the completion.
// PostgreSQL only: the memory store has no deadline to exhaust.
func TestChargeLatencyLongerThanStoreTimeout(t *testing.T) {
	e := newEnv(t, Options{})
	e.setFaults(t, Faults{Latency: storeTimeout + 500*time.Millisecond})
	if got := e.post(t, "key-slow", chargeJSON("ord-1", 1000)); got.code != http.StatusCreated {
		t.Fatalf("code = %d %s, want 201", got.code, got.body)
	}
	if r := e.row(t, "key-slow"); r.State != stateCompleted {
		t.Fatalf("state = %s, want completed", r.State)
	}
}

func TestChargeAbandonedDuringLatencyReleasesKey(t *testing.T) {
	eachStore(t, Options{}, func(t *testing.T, e *env) {
		e.setFaults(t, Faults{Latency: time.Minute})
		req := gateway.ChargeRequest{IdempotencyKey: "key-gone", OrderID: "ord-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR"}
		client := gateway.NewClient(e.url, 2*time.Minute, 8)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		callErr := make(chan error, 1)
		go func() {
			_, err := client.Charge(ctx, req)
			callErr <- err
		}()
		kittest.Eventually(t, 10*time.Second, "the in-flight row", func() (bool, error) { return e.count(t) == 1, nil })
		cancel() // the client leaves while the gateway waits out the latency

		if err := <-callErr; !errors.Is(err, gateway.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v, want ErrUnavailable and context.Canceled", err)
		}
		kittest.Eventually(t, 10*time.Second, "the abandoned request", func() (bool, error) {
			return e.counter(t, "gateway_requests_total", "result", resultAbandoned) == 1, nil
		})
		if n := e.count(t); n != 0 {
			t.Fatalf("the abandoned claim left %d rows", n)
		}
		e.setFaults(t, Faults{})
		ch, err := client.Charge(context.Background(), req)
		if err != nil || ch.Replayed {
			t.Fatalf("retry = %+v, %v; want a fresh charge", ch, err)
		}
	})
}

// postConcurrently sends n identical requests at once.
func postConcurrently(t *testing.T, e *env, n int, key, body string) []reply {
	t.Helper()
	replies := make([]reply, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = e.send(http.MethodPost, "/v1/charges", key, body)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return replies
}

// assertOneCharge checks that concurrent requests for one key produced one
// charge: every answer is 201 or 409, and every 201 names the same charge.
func assertOneCharge(t *testing.T, e *env, replies []reply, key string) {
	t.Helper()
	ids := map[string]int{}
	codes := map[int]int{}
	for _, r := range replies {
		codes[r.code]++
		if r.code != http.StatusCreated {
			continue
		}
		var ch chargeResponse
		if err := json.Unmarshal(r.body, &ch); err != nil {
			t.Fatal(err)
		}
		ids[ch.ID]++
	}
	if codes[http.StatusCreated]+codes[http.StatusConflict] != len(replies) || codes[http.StatusCreated] == 0 {
		t.Fatalf("codes = %v, want only 201 and 409 with at least one 201", codes)
	}
	if len(ids) != 1 {
		t.Fatalf("charge ids among the 201s = %v, want one", ids)
	}
	if n := e.count(t); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	r := e.row(t, key)
	if _, ok := ids[r.ID]; !ok || r.State != stateCompleted {
		t.Fatalf("row = %+v, want the completed charge %v", r, ids)
	}
	t.Logf("codes %v", codes)
}

// A real gateway forgets an idempotency key some time after its charge
// completed (Stripe after 24 hours). With KeyTTL the fake gateway does too: the
// same key and request after that is a new charge, the card charged twice. A
// retry or a dead-letter replay that late is not protected by the key.
func TestChargeExpiredKeyChargesAgain(t *testing.T) {
	// The key lifetime is an hour and the charges are made older than it in
	// the store, not by waiting: a lifetime of a second let the new charge
	// expire too while the concurrent requests below ran on a loaded machine.
	// The in-flight takeover is longer than the ages, so an old claim stays
	// in flight.
	eachStore(t, Options{InFlightTakeover: 3 * time.Hour}, func(t *testing.T, e *env) {
		e.setFaults(t, Faults{KeyTTL: time.Hour})
		body := chargeJSON("ord-ttl", 1000)
		first := e.post(t, "key-ttl", body)
		if first.code != http.StatusCreated {
			t.Fatalf("first charge: %d %s", first.code, first.body)
		}
		if got := e.post(t, "key-ttl", body); got.replayed != "true" || !bytes.Equal(got.body, first.body) {
			t.Fatalf("within the TTL: %d %s (replayed %q), want the stored answer", got.code, got.body, got.replayed)
		}
		// A key in flight is not forgotten, however old: only completed ones are.
		req := chargeRequest{OrderID: "ord-flying", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR"}
		if _, ok, err := e.srv.store.claim(context.Background(), "ch_flying", "key-flying", req.fingerprint(), req); err != nil || !ok {
			t.Fatalf("claim = %v, %v", ok, err)
		}
		e.probe.age(t, "key-flying", 2*time.Hour)
		e.probe.ageCompleted(t, "key-ttl", 2*time.Hour)

		// Concurrent requests after the expiry: exactly one charges again.
		replies := postConcurrently(t, e, 10, "key-ttl", body)
		ids := map[string]bool{}
		for _, r := range replies {
			var ch chargeResponse
			if r.code == http.StatusCreated && json.Unmarshal(r.body, &ch) == nil {
				ids[ch.ID] = true
			} else if r.code != http.StatusConflict {
				t.Fatalf("after the expiry: %d %s, want 201 or 409", r.code, r.body)
			}
		}
		var old chargeResponse
		if err := json.Unmarshal(first.body, &old); err != nil {
			t.Fatal(err)
		}
		if len(ids) != 1 || ids[old.ID] {
			t.Fatalf("charges answered after the expiry %v, want one new one (the first was %s)", ids, old.ID)
		}
		if n := e.count(t); n != 3 { // the first charge, the second, the one in flight
			t.Fatalf("%d charges stored, want 3", n)
		}
		if got := e.counter(t, "gateway_charges_total", "status", statusSucceeded); got != 2 {
			t.Fatalf("charges executed = %v, want 2: the key's charge twice", got)
		}
		if got := e.counter(t, "gateway_keys_forgotten_total", "", ""); got != 1 {
			t.Fatalf("keys forgotten = %v, want 1", got)
		}
		if got := e.post(t, "key-flying", chargeJSON("ord-flying", 1000)); got.code != http.StatusConflict {
			t.Fatalf("an old in-flight key: %d %s, want 409", got.code, got.body)
		}
		// Forgotten means forgotten: another request on the key is not a 422.
		e.probe.ageCompleted(t, "key-ttl", 2*time.Hour)
		if got := e.post(t, "key-ttl", chargeJSON("ord-other", 2500)); got.code != http.StatusCreated || got.replayed != "" {
			t.Fatalf("another request on an expired key: %d %s, want a new charge", got.code, got.body)
		}
	})
}
