package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/demo/verify"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/migrations"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// inboxctl runs the command as main does, with stdin as its input.
func inboxctl(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), args, strings.NewReader(stdin), &out)
	return out.String(), err
}

// Every usage error is refused before anything is contacted, and says what is wrong.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"dlq"}, "dlq: missing subcommand"},
		{[]string{"dlq", "peek"}, `dlq: unknown subcommand "peek"`},
		{[]string{"dlq", "list", "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"dlq", "list", "--limit", "many"}, `invalid value "many" for flag -limit`},
		{[]string{"dlq", "list", "extra"}, `unexpected argument "extra"`},
		{[]string{"dlq", "replay"}, "exactly one of --id, --reason or --all"},
		{[]string{"dlq", "replay", "--id", "m-1", "--all"}, "exactly one of --id, --reason or --all"},
		{[]string{"dlq", "replay", "--all", "--max-replays", "0"}, "--max-replays must be at least 1"},
		{[]string{"dlq", "purge", "--force"}, "flag provided but not defined: -force"},
		{[]string{"inbox"}, "inbox: missing subcommand"},
		{[]string{"inbox", "vacuum"}, `inbox: unknown subcommand "vacuum"`},
		{[]string{"inbox", "retry"}, "exactly one of --id, --key or --all"},
		{[]string{"inbox", "skip", "--all"}, "flag provided but not defined: -all"},
		{[]string{"inbox", "export", "--id", "m", "--key", "k"}, "exactly one of --id, --key or --all"},
		{[]string{"inbox", "parked", "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"inbox", "prune", "--older-than", "1h"}, "--older-than 1h0m0s is below 24h0m0s"},
		{[]string{"inbox", "prune", "--batch", "0"}, "--batch must be between 1 and 100000"},
		{[]string{"migrate", "payments"}, `unexpected arguments ["payments"]`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := inboxctl(t, "", tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// help prints every command inboxctl takes, its own and the service's, and
// none it does not (serve, healthcheck).
func TestHelpPrintsUsage(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"dlq", "replay", "-h"}, {"inbox", "prune", "--help"}, {"verify", "-h"}} {
		out, err := inboxctl(t, "", args...)
		if err != nil {
			t.Errorf("%v: %v", args, err)
		}
		for _, want := range []string{"\n  verify (--summary FILE", "\n  migrate gateway ", "\n  dlq replay (--id ID | --reason R | --all)", "\n  outbox retry "} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: the usage lacks %q:\n%s", args, want, out)
			}
		}
		if strings.Contains(out, "serve: consume") || strings.Contains(out, "healthcheck") || strings.Contains(out, "SERVICE") {
			t.Errorf("%v: the usage lists what inboxctl does not do:\n%s", args, out)
		}
	}
}

// A usage error is the mistake and a line naming inboxctl's help, not the
// whole usage.
func TestUsageErrorsPointToHelp(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}, {"verify", "--bogus"}, {"verify", "extra"}, {"dlq", "peek"}, {"migrate", "gateway", "x"}} {
		_, err := inboxctl(t, "", args...)
		if err == nil {
			t.Errorf("%q: no error", args)
			continue
		}
		if lines := strings.Split(err.Error(), "\n"); len(lines) != 2 || lines[1] != "run 'inboxctl help' for usage" {
			t.Errorf("%q: error %q, want the mistake and then \"run 'inboxctl help' for usage\"", args, err)
		}
	}
}

// dlqEnv is a vhost with the service's default topology, pointed to by AMQP_URL.
type dlqEnv struct {
	t    *testing.T
	ch   *amqp.Channel
	topo rabbit.Topology
}

func newDLQEnv(t *testing.T) *dlqEnv {
	t.Helper()
	url := kittest.VHost(t)
	t.Setenv("AMQP_URL", url)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	e := &dlqEnv{t: t, ch: ch, topo: rabbit.Topology{
		Exchange: "orders", RoutingKey: "order.placed", Queue: "payments.order-placed",
		DeadLetterExchange: "payments.dlx", DeadLetterQueue: "payments.order-placed.dlq", DeliveryLimit: 20,
		RetryDelays: []time.Duration{time.Second},
	}}
	if err := e.topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return e
}

// deadLetter puts a dead letter published a minute ago.
func (e *dlqEnv) deadLetter(id, reason string) {
	e.t.Helper()
	e.deadLetterPublished(id, reason, time.Now().Add(-time.Minute))
}

// deadLetterPublished puts a dead letter published at the time given, in the
// header timestamp_in_ms as the bench's producer sets it.
func (e *dlqEnv) deadLetterPublished(id, reason string, at time.Time) {
	e.t.Helper()
	e.put(amqp.Publishing{
		MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Body: fmt.Appendf(nil, `{"order_id":"order-of-%s"}`, id),
		Headers: amqp.Table{
			wire.HeaderDeadLetterReason: reason, wire.HeaderAttempt: int32(5),
			wire.HeaderTimestampMillis: at.UnixMilli(),
		},
	})
}

func (e *dlqEnv) put(p amqp.Publishing) {
	e.t.Helper()
	if err := rabbit.PublishConfirmed(context.Background(), e.ch, e.topo.DeadLetterExchange, e.topo.DeadLetterKey(), p); err != nil {
		e.t.Fatal(err)
	}
}

func (e *dlqEnv) waitDepth(queue string, n int) {
	e.t.Helper()
	kittest.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d messages in %s", n, queue), func() (bool, error) {
		q, err := e.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages == n, err
	})
}

func TestDLQPurgeAsksForTheQueueName(t *testing.T) {
	e := newDLQEnv(t)
	e.deadLetter("m-1", "malformed_json")
	e.deadLetter("m-2", "malformed_json")
	e.waitDepth(e.topo.DeadLetterQueue, 2)
	for _, stdin := range []string{"", "\n", "yes\n", "payments.order-placed\n"} {
		out, err := inboxctl(t, stdin, "dlq", "purge")
		if err == nil || !strings.Contains(err.Error(), "nothing purged") {
			t.Fatalf("confirmation %q: err = %v, want a refusal", stdin, err)
		}
		if !strings.Contains(out, "payments.order-placed.dlq holds 2 messages") {
			t.Errorf("prompt %q does not say what would be deleted", out)
		}
		e.waitDepth(e.topo.DeadLetterQueue, 2)
	}
	out, err := inboxctl(t, "payments.order-placed.dlq\n", "dlq", "purge")
	if err != nil || !strings.Contains(out, "purged 2 messages from payments.order-placed.dlq") {
		t.Fatalf("confirmed purge: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.DeadLetterQueue, 0)

	e.deadLetter("m-3", "malformed_json")
	e.waitDepth(e.topo.DeadLetterQueue, 1)
	if out, err := inboxctl(t, "", "dlq", "purge", "--yes"); err != nil || !strings.Contains(out, "purged 1 messages") {
		t.Fatalf("purge --yes: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.DeadLetterQueue, 0)
}

func TestDLQListAndReplay(t *testing.T) {
	e := newDLQEnv(t)
	e.deadLetter("m-1", "retries_exhausted")
	e.deadLetter("m-2", "malformed_json")
	e.waitDepth(e.topo.DeadLetterQueue, 2)

	out, err := inboxctl(t, "", "dlq", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var listing struct {
		Depth    int `json:"depth"`
		Messages []struct {
			ID       string            `json:"message_id"`
			Attrs    map[string]string `json:"attributes"`
			Reason   string            `json:"reason"`
			Attempts int               `json:"attempts"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(out), &listing); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if listing.Depth != 2 || len(listing.Messages) != 2 || listing.Messages[0].Attrs["order_id"] != "order-of-m-1" || listing.Messages[0].Attempts != 5 {
		t.Errorf("list --json: %+v", listing)
	}
	e.waitDepth(e.topo.DeadLetterQueue, 2)
	if out, err := inboxctl(t, "", "dlq", "list"); err != nil || !strings.Contains(out, "m-2") || !strings.Contains(out, "MESSAGE ID") {
		t.Errorf("list: err %v, output %q", err, out)
	}

	e.waitDepth(e.topo.DeadLetterQueue, 2)
	out, err = inboxctl(t, "", "dlq", "replay", "--reason", "retries_exhausted", "--dry-run")
	if err != nil || !strings.Contains(out, "would replay m-1") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("replay --dry-run: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.DeadLetterQueue, 2)
	out, err = inboxctl(t, "", "dlq", "replay", "--id", "m-1")
	if err != nil || !strings.Contains(out, "replayed m-1 (order_id=order-of-m-1, reason retries_exhausted) as replay 1 of 3") {
		t.Fatalf("replay --id: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.Queue, 1)
	e.waitDepth(e.topo.DeadLetterQueue, 1)

	// An id that is not there is an error a script sees, not a line of zeros;
	// the message that is there stays.
	out, err = inboxctl(t, "", "dlq", "replay", "--id", "m-1")
	if err == nil || !strings.Contains(err.Error(), `no message with id "m-1"`) || !strings.Contains(out, "1 not selected") {
		t.Fatalf("replay --id of a message not there: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.DeadLetterQueue, 1)
	// A reason that selects nothing is not an error: there is nothing to do.
	out, err = inboxctl(t, "", "dlq", "replay", "--reason", "no_such_reason")
	if err != nil || !strings.Contains(out, "0 replayed") {
		t.Fatalf("replay --reason selecting nothing: err %v, output %q", err, out)
	}
}

func TestInboxPrune(t *testing.T) {
	gdb, url := kittest.MigratedDB(t, migrations.Inbox, migrations.Buffered, migrations.Outbox)
	t.Setenv("DATABASE_URL", url)
	err := gdb.Exec(`
		INSERT INTO inbox (message_id, consumer, payload_sha256, received_at)
		SELECT 'm-' || g, 'payment-service', sha256(g::text::bytea),
		       now() - CASE WHEN g <= 3 THEN interval '15 days' ELSE interval '1 day' END
		FROM generate_series(1, 5) g`).Error
	if err != nil {
		t.Fatal(err)
	}
	out, err := inboxctl(t, "", "inbox", "prune", "--dry-run")
	if err != nil || !strings.Contains(out, "would delete 3 inbox rows of consumer payment-service") {
		t.Fatalf("dry run: err %v, output %q", err, out)
	}
	out, err = inboxctl(t, "", "inbox", "prune", "--batch", "2")
	if err != nil || !strings.Contains(out, "deleted 3 inbox rows of consumer payment-service") || !strings.Contains(out, "in 2 batches of up to 2") {
		t.Fatalf("prune: err %v, output %q", err, out)
	}
	var left int64
	if err := gdb.Table("inbox").Count(&left).Error; err != nil || left != 2 {
		t.Fatalf("%d rows left (%v), want 2", left, err)
	}
}

// inboxctl migrate applies the payment service's schemas, each with its own
// version table, and migrate gateway the fake gateway's.
func TestMigrate(t *testing.T) {
	t.Setenv("DATABASE_URL", kittest.Postgres(t))
	out, err := inboxctl(t, "", "migrate")
	if err != nil || !strings.Contains(out, "payment-service: inbox schema at version 1") || !strings.Contains(out, "payment-service: payments schema at version 1") {
		t.Fatalf("err %v, output %q", err, out)
	}
	out, err = inboxctl(t, "", "migrate")
	if err != nil || !strings.Contains(out, "(applied now: [])") {
		t.Fatalf("second run: err %v, output %q; want nothing applied", err, out)
	}
	t.Setenv("GATEWAY_DATABASE_URL", kittest.Postgres(t))
	if out, err := inboxctl(t, "", "migrate", "gateway"); err != nil || !strings.Contains(out, "fake-gateway: gateway schema at version") {
		t.Fatalf("migrate gateway: err %v, output %q", err, out)
	}
}

// A dead letter first published longer ago than the idempotency keys live
// (IDEMPOTENCY_KEY_TTL, less the retries a replay may take) is refused and left
// in the queue: its charge may have gone through, and the gateway would no
// longer recognise the key. --force replays it all the same.
func TestDLQReplayRefusesDeadLettersOlderThanTheKeys(t *testing.T) {
	e := newDLQEnv(t)
	e.deadLetterPublished("old", "retries_exhausted", time.Now().Add(-25*time.Hour))
	e.deadLetterPublished("young", "retries_exhausted", time.Now().Add(-time.Hour))
	e.put(amqp.Publishing{ // a producer that sets no publish time: only the runtime's dead-lettering time tells
		MessageId: "undated", ContentType: "application/json", Body: []byte(`{"order_id":"order-of-undated"}`),
		Headers: amqp.Table{
			wire.HeaderDeadLetterReason: "retries_exhausted",
			wire.HeaderDeadLetteredAt:   time.Now().Add(-30 * time.Hour).UTC().Format(time.RFC3339Nano),
		},
	})
	e.waitDepth(e.topo.DeadLetterQueue, 3)

	out, err := inboxctl(t, "", "dlq", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"25h0m too old", "1h0m ", "30h0m* too old", "dlq replay refuses", "no publish time"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	e.waitDepth(e.topo.DeadLetterQueue, 3)

	out, err = inboxctl(t, "", "dlq", "replay", "--reason", "retries_exhausted")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"replayed young (order_id=order-of-young, reason retries_exhausted) as replay 1 of 3",
		"refused old (order_id=order-of-old, reason retries_exhausted): first published 25h0m ago",
		"IDEMPOTENCY_KEY_TTL 24h0m0s",
		"refused undated (order_id=order-of-undated, reason retries_exhausted): dead-lettered 30h0m ago (no publish time on the message",
		"1 replayed, 0 refused at the replay cap, 2 refused as too old, 0 not selected",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("replay output lacks %q:\n%s", want, out)
		}
	}
	e.waitDepth(e.topo.Queue, 1)
	e.waitDepth(e.topo.DeadLetterQueue, 2)

	out, err = inboxctl(t, "", "dlq", "replay", "--id", "old", "--force")
	if err != nil || !strings.Contains(out, "replayed old (order_id=order-of-old, reason retries_exhausted) as replay 1 of 3") ||
		!strings.Contains(out, "forced old (order_id=order-of-old): first published 25h0m ago, older than 23h57m39s") {
		t.Fatalf("replay --force: err %v, output %q", err, out)
	}
	e.waitDepth(e.topo.Queue, 2)
	e.waitDepth(e.topo.DeadLetterQueue, 1)
}

// verify reads the whole dead-letter queue through the service's own `dlq
// list --json`, each message with its reason and its order, and leaves every
// one of them in the queue.
func TestVerifyReadsEveryDeadLetterAndLeavesThem(t *testing.T) {
	e := newDLQEnv(t)
	for i := range 120 { // more than dlq list's default limit of 100
		e.deadLetter(fmt.Sprintf("m-%d", i), "malformed_json")
	}
	e.waitDepth(e.topo.DeadLetterQueue, 120)
	conn, err := amqp.Dial(os.Getenv("AMQP_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := verify.NewBroker(conn, payment.Service(), e.topo.DeadLetterQueue).DeadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 120 {
		t.Fatalf("%d dead letters, want 120", len(got))
	}
	seen := map[string]bool{}
	for _, d := range got {
		if d.Reason != "malformed_json" || d.Attrs["order_id"] != "order-of-"+d.ID {
			t.Errorf("dead letter %+v: want reason malformed_json and order order-of-%s", d, d.ID)
		}
		seen[d.ID] = true
	}
	if len(seen) != 120 {
		t.Errorf("%d distinct ids among 120 dead letters", len(seen))
	}
	e.waitDepth(e.topo.DeadLetterQueue, 120)
}
