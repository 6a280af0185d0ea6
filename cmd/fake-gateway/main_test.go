package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/gateway"
	"github.com/inbox-template/payment-service/internal/testenv"
)

func TestRunServesUntilCancelled(t *testing.T) {
	addr := testenv.FreeAddr(t)
	t.Setenv("DATABASE_URL", testenv.Postgres(t))
	t.Setenv("HTTP_ADDR", addr)
	t.Setenv("FAULTS_ENABLED", "true")
	t.Setenv("LOG_LEVEL", "debug")

	ctx, cancel := context.WithCancel(context.Background())
	var logs testenv.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, &logs, &logs) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	testenv.Eventually(t, 15*time.Second, "the gateway's /healthz", func() (bool, error) {
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
	for _, want := range []string{`"msg":"starting"`, `"IN_FLIGHT_TAKEOVER":"30s"`, `"msg":"listening"`, `"msg":"stopped"`, `"order_id":"order-1"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
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
		{"unknown argument", nil, []string{"serve"}, "unknown arguments"},
		{"healthcheck with no server", nil, []string{"healthcheck"}, "healthcheck"},
		{"healthcheck of an address without a port", map[string]string{"HTTP_ADDR": "localhost"}, []string{"healthcheck"}, "HTTP_ADDR"},
		{"database down", map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?connect_timeout=1"}, nil, "database"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("HTTP_ADDR", testenv.FreeAddr(t))
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
