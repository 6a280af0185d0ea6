package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/payment/gateway"
	"github.com/inbox-template/payment-service/kit/kittest"
)

func TestRunServesUntilCancelled(t *testing.T) {
	addr := kittest.FreeAddr(t)
	t.Setenv("DATABASE_URL", kittest.Postgres(t))
	t.Setenv("HTTP_ADDR", addr)
	t.Setenv("FAULTS_ENABLED", "true")
	t.Setenv("LOG_LEVEL", "debug")

	ctx, cancel := context.WithCancel(context.Background())
	var logs kittest.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, &logs, &logs) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	kittest.Eventually(t, 15*time.Second, "the gateway's /healthz", func() (bool, error) {
		return run(context.Background(), []string{"healthcheck"}, &logs, &logs) == nil, nil
	})
	ch, err := gateway.NewClient("http://"+addr, 5*time.Second, 8).Charge(context.Background(), gateway.ChargeRequest{
		IdempotencyKey: "order-1", OrderID: "order-1", CustomerID: "cust-1", AmountCents: 1002, Currency: "EUR",
	})
	if err != nil || ch.Status != gateway.StatusDeclined {
		t.Fatalf("charge = %+v, %v; want declined", ch, err)
	}
	resp, err := http.Get("http://" + addr + "/faults")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /faults with FAULTS_ENABLED=true = %d", resp.StatusCode)
	}

	cancel()
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("run = %v, want nil after cancel", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	for _, want := range []string{`"msg":"starting"`, `"IN_FLIGHT_TAKEOVER":"30s"`, `"KEY_TTL":"0s"`, `"msg":"listening"`, `"msg":"stopped"`, `"order_id":"order-1"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
}

// TestRunServesFromMemoryWithoutDatabase: STORE=memory never connects to
// DATABASE_URL, which here points nowhere.
func TestRunServesFromMemoryWithoutDatabase(t *testing.T) {
	addr := kittest.FreeAddr(t)
	t.Setenv("STORE", "memory")
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	t.Setenv("HTTP_ADDR", addr)
	t.Setenv("LOG_LEVEL", "warn")

	ctx, cancel := context.WithCancel(context.Background())
	var logs kittest.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, &logs, &logs) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	kittest.Eventually(t, 15*time.Second, "the gateway's /healthz", func() (bool, error) {
		return run(context.Background(), []string{"healthcheck"}, &logs, &logs) == nil, nil
	})
	client := gateway.NewClient("http://"+addr, 5*time.Second, 8)
	req := gateway.ChargeRequest{IdempotencyKey: "order-1", OrderID: "order-1", CustomerID: "cust-1", AmountCents: 1000, Currency: "EUR"}
	first, err := client.Charge(context.Background(), req)
	if err != nil || first.Replayed {
		t.Fatalf("charge = %+v, %v; want a new charge", first, err)
	}
	again, err := client.Charge(context.Background(), req)
	if err != nil || !again.Replayed || again.ID != first.ID {
		t.Fatalf("second charge = %+v, %v; want the replay of %s", again, err, first.ID)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run = %v, want nil after cancel", err)
	}
	done <- nil // for the cleanup
	if !strings.Contains(logs.String(), "charges are kept in memory") {
		t.Errorf("logs do not warn that charges are kept in memory:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), `"msg":"charge request"`) {
		t.Errorf("LOG_LEVEL=warn still logs each charge:\n%s", logs.String())
	}
}

func TestRunFailures(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"invalid config", map[string]string{"FAULT_ERROR_RATE": "2"}, nil, "FAULT_ERROR_RATE"},
		{"unknown store", map[string]string{"STORE": "redis"}, nil, "STORE"},
		{"unknown argument", nil, []string{"serve"}, "unknown arguments"},
		{"healthcheck with no server", nil, []string{"healthcheck"}, "healthcheck"},
		{"healthcheck of an address without a port", map[string]string{"HTTP_ADDR": "localhost"}, []string{"healthcheck"}, "HTTP_ADDR"},
		{"database down", map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?connect_timeout=1"}, nil, "database"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("HTTP_ADDR", kittest.FreeAddr(t))
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			err := run(context.Background(), tt.args, &out, &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run = %v, want an error about %s", err, tt.want)
			}
		})
	}
}
