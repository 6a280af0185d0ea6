package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/payment/orders"
	"github.com/inbox-template/payment-service/kit/kittest"
)

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"-counts", "5"}, "flag provided but not defined: -counts"},
		{"count not a number", []string{"-count", "many"}, `invalid value "many" for flag -count`},
		{"negative count", []string{"-count", "-1"}, "invalid flag -count: must not be negative"},
		{"negative poison", []string{"-poison", "-3"}, "invalid flag -poison: must not be negative"},
		{"duplicate rate above 1", []string{"-duplicate-rate", "1.5"}, "invalid flag -duplicate-rate: must be between 0 and 1"},
		{"duplicate rate NaN", []string{"-duplicate-rate", "NaN"}, "invalid flag -duplicate-rate"},
		{"negative republish rate", []string{"-republish-rate", "-0.1"}, "invalid flag -republish-rate: must be between 0 and 1"},
		{"negative rate", []string{"-rate", "-5"}, "invalid flag -rate: must not be negative"},
		{"zero timeout", []string{"-timeout", "0s"}, "invalid flag -timeout: must be positive"},
		{"timeout without unit", []string{"-timeout", "30"}, `invalid value "30" for flag -timeout`},
		{"run id with a space", []string{"-run-id", "a b"}, "run id"},
		{"positional argument", []string{"-count", "1", "extra"}, `unexpected arguments ["extra"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
			// main prints the error once: nothing else says it, and the
			// usage is one flag away.
			if err != nil && !strings.HasSuffix(err.Error(), "\nrun 'order-publisher -h' for usage") {
				t.Errorf("run(%q) = %q, want it to end with the hint to -h", tt.args, err)
			}
			if stderr.Len() > 0 {
				t.Errorf("run(%q) wrote to stderr besides its error:\n%s", tt.args, stderr.String())
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-h"}, &stdout, &stderr); err != nil {
		t.Fatalf("run(-h) = %v", err)
	}
	if !strings.Contains(stderr.String(), "-duplicate-rate") {
		t.Errorf("usage does not list the flags:\n%s", stderr.String())
	}
}

func TestRunPublishesAndWritesSummary(t *testing.T) {
	url := kittest.VHost(t)
	setBroker(t, url)
	bindQueue(t, url)
	path := filepath.Join(t.TempDir(), "summary.json")
	dir := filepath.Join(t.TempDir(), "runs") // SUMMARY_DIR: made if missing
	t.Setenv("SUMMARY_DIR", dir)
	var stdout, stderr bytes.Buffer

	err := run(testContext(t), []string{"-count", "25", "-run-id", "cli", "-seed", "5", "-duplicate-rate", "0.4",
		"-republish-rate", "0.4", "-poison", "11", "-rate", "0", "-summary", path}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run() = %v\nstderr:\n%s", err, stderr.String())
	}
	if kept := readSummary(t, filepath.Join(dir, "cli.json")); kept["run_id"] != "cli" || kept["orders"] != 25.0 || kept["poison_total"] != 11.0 {
		t.Errorf("SUMMARY_DIR/cli.json %v, want the run's summary", kept)
	}
	sum := readSummary(t, path)
	if sum["run_id"] != "cli" || sum["orders"] != 25.0 || sum["poison_total"] != 11.0 || sum["ok"] != true ||
		sum["confirmed"] != sum["published"] || sum["returned"] != 0.0 {
		t.Errorf("summary %v", sum)
	}
	for _, want := range []string{"run id:", "cli", "messages published:", "confirmed:", "result:", "ok"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	if n := queueLength(t, url); float64(n) != sum["published"] {
		t.Errorf("queue holds %d messages, summary says %v published", n, sum["published"])
	}
}

func TestRunFailsWhenNoQueueIsBound(t *testing.T) {
	url := kittest.VHost(t)
	setBroker(t, url)
	path := filepath.Join(t.TempDir(), "summary.json")
	var stdout, stderr bytes.Buffer

	err := run(testContext(t), []string{"-count", "10", "-summary", path}, &stdout, &stderr)
	want := "no queue bound to exchange orders with key order.placed: start payment-service first"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("run() = %v, want an error containing %q", err, want)
	}
	if sum := readSummary(t, path); sum["ok"] != false || sum["returned"] == 0.0 || !strings.Contains(sum["error"].(string), want) {
		t.Errorf("summary %v does not report the failure", sum)
	}
	if !strings.Contains(stdout.String(), "FAILED") {
		t.Errorf("stdout does not say the run failed:\n%s", stdout.String())
	}
}

func TestRunFailsOnBadConfig(t *testing.T) {
	t.Setenv("AMQP_URL", "http://localhost:5672/")
	err := run(t.Context(), nil, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "AMQP_URL") {
		t.Errorf("run() = %v, want an error naming AMQP_URL", err)
	}
}

func setBroker(t *testing.T, url string) {
	t.Setenv("AMQP_URL", url)
	t.Setenv("EXCHANGE", "orders")
	t.Setenv("ROUTING_KEY", "order.placed")
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func readSummary(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sum map[string]any
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("summary %s: %v", b, err)
	}
	return sum
}

func bindQueue(t *testing.T, url string) {
	t.Helper()
	kittest.WithChannel(t, url, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare("orders", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("payments", true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind("payments", "order.placed", "orders", false, nil)
	})
}

// queueLength counts the queued messages and checks that every one that is
// not poison decodes.
func queueLength(t *testing.T, url string) int {
	t.Helper()
	n := 0
	kittest.WithChannel(t, url, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get("payments", true)
			if err != nil || !ok {
				return err
			}
			n++
			if _, err := orders.Decode(d.Body); err != nil && !isPoison(d) {
				t.Errorf("message %q: %v", d.MessageId, err)
			}
		}
	})
	return n
}

func isPoison(d amqp.Delivery) bool {
	return strings.HasPrefix(d.MessageId, "poison-") || d.MessageId == ""
}

// -once publishes a load the first time and nothing after, as long as its
// file exists: the Compose demo load, once per fresh volume.
func TestRunOnce(t *testing.T) {
	url := kittest.VHost(t)
	setBroker(t, url)
	bindQueue(t, url)
	once := filepath.Join(t.TempDir(), "published")
	for range 2 {
		var stdout, stderr bytes.Buffer
		if err := run(testContext(t), []string{"-count", "5", "-once", once}, &stdout, &stderr); err != nil {
			t.Fatalf("run() = %v\nstderr:\n%s", err, stderr.String())
		}
	}
	if n := queueLength(t, url); n != 5 {
		t.Fatalf("queue holds %d messages after two runs, want the first run's 5", n)
	}
	if _, err := os.Stat(once); err != nil {
		t.Fatalf("-once file: %v", err)
	}
}
