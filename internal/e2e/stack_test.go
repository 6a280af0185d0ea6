package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// stack is the fake gateway and the payment service running as processes on
// their own databases and vhost.
type stack struct {
	amqpURL, paymentsDB, gatewayDB string
	gatewayAddr, serviceAddr       string
	serviceExtra                   []string
	service                        *proc
}

// startStack starts the stack; extra environment goes to the gateway and the service.
func startStack(t *testing.T, gatewayEnv, serviceEnv []string) *stack {
	t.Helper()
	s := &stack{
		amqpURL: kittest.VHost(t), paymentsDB: kittest.Postgres(t), gatewayDB: kittest.Postgres(t),
		gatewayAddr: kittest.FreeAddr(t), serviceAddr: kittest.FreeAddr(t),
	}
	start(t, "fake-gateway", append([]string{
		"DATABASE_URL=" + s.gatewayDB, "HTTP_ADDR=" + s.gatewayAddr, "IN_FLIGHT_TAKEOVER=" + inFlightWindow,
	}, gatewayEnv...))
	waitHTTP(t, "http://"+s.gatewayAddr+"/healthz")
	s.serviceExtra = serviceEnv
	s.startService(t)
	return s
}

// The stack's short retries (RETRY_DELAYS=100ms,500ms and 5 attempts: at
// least 1.28s with the jitter) must outlast the gateway's in-flight window,
// which the service is told of: 1s, not the fake gateway's default 30s.
const inFlightWindow = "1s"

// startService starts (or restarts) the payment service.
func (s *stack) startService(t *testing.T) {
	t.Helper()
	env := append([]string{
		"AMQP_URL=" + s.amqpURL, "DATABASE_URL=" + s.paymentsDB, "GATEWAY_URL=http://" + s.gatewayAddr,
		"HTTP_ADDR=" + s.serviceAddr, "RETRY_DELAYS=100ms,500ms", "GATEWAY_IN_FLIGHT_TIMEOUT=" + inFlightWindow, "LOG_LEVEL=info",
	}, append(kittest.GroupCommitVars(), s.serviceExtra...)...)
	s.service = start(t, "payment-service", env)
	waitHTTP(t, "http://"+s.serviceAddr+"/readyz")
}

func scalar(t *testing.T, url, sql string) int {
	t.Helper()
	return kittest.Count(t, url, sql)
}

func queueDepth(t *testing.T, amqpURL, queue string) int {
	return kittest.QueueDepth(t, amqpURL, queue)
}

// The project's first "done when": 1000 orders with 20% duplicates and 6 poison
// messages end as exactly 1000 payments, at most 1000 charges, none charged
// twice, and 6 messages in the dead-letter queue.
func TestThousandOrdersWithDuplicatesAndPoison(t *testing.T) {
	thousandOrders(t, nil, nil)
}

// The same with the buffered inbox. The poison the runtime refuses (no id,
// a wrong content type) is dead-lettered at ingest; what only the handler
// can judge (an invalid body) is stored and parked, and inboxctl inbox
// export moves it to the dead-letter queue, where the 6 are counted.
func TestThousandOrdersBuffered(t *testing.T) {
	thousandOrders(t, bufferedEnv(), func(t *testing.T, s *stack) {
		kittest.Eventually(t, time.Minute, "the parked poison and the dead-lettered poison to make 6", func() (bool, error) {
			parked := scalar(t, s.paymentsDB, "SELECT count(*) FROM inbox_messages WHERE status = 'parked'")
			return parked > 0 && parked+queueDepth(t, s.amqpURL, "payments.order-placed.dlq") == 6, nil
		})
		code, out := run(t, time.Minute, "inboxctl", []string{"AMQP_URL=" + s.amqpURL, "DATABASE_URL=" + s.paymentsDB}, "inbox", "export", "--all")
		if code != 0 || !strings.Contains(out, "exported") {
			t.Fatalf("inboxctl inbox export --all: exit %d\n%s", code, out)
		}
		if n := scalar(t, s.paymentsDB, "SELECT count(*) FROM inbox_messages WHERE status NOT IN ('processed', 'dead_lettered')"); n != 0 {
			t.Errorf("%d stored messages neither processed nor exported", n)
		}
	})
}

// bufferedEnv is the service's environment for the buffered inbox, with short
// processing retries, plus extra.
func bufferedEnv(extra ...string) []string {
	return append([]string{"INBOX_MODE=buffered", "BUFFER_RETRY_DELAYS=100ms,500ms", "BUFFER_POLL_INTERVAL=1s"}, extra...)
}

// thousandOrders runs the thousand orders on a service with serviceEnv;
// settle, if set, runs once every order is paid, before the checks.
func thousandOrders(t *testing.T, serviceEnv []string, settle func(t *testing.T, s *stack)) {
	s := startStack(t, nil, serviceEnv)
	summaryPath := filepath.Join(t.TempDir(), "summary.json")
	code, out := run(t, 5*time.Minute, "order-publisher", []string{"AMQP_URL=" + s.amqpURL},
		"-count", "1000", "-duplicate-rate", "0.2", "-poison", "6", "-summary", summaryPath)
	if code != 0 {
		t.Fatalf("order-publisher exited %d:\n%s", code, out)
	}
	var summary struct {
		Orders      int `json:"orders"`
		Duplicates  int `json:"duplicates"`
		PoisonTotal int `json:"poison_total"`
	}
	raw, err := os.ReadFile(summaryPath)
	if err == nil {
		err = json.Unmarshal(raw, &summary)
	}
	if err != nil || summary.Orders != 1000 || summary.PoisonTotal != 6 || summary.Duplicates < 100 {
		t.Fatalf("publisher summary %+v (%v): want 1000 orders, ~200 duplicates, 6 poison", summary, err)
	}

	kittest.Reaches(t, time.Minute, "1000 payments", 1000, func() (int, error) {
		return scalar(t, s.paymentsDB, "SELECT count(*) FROM payments"), nil
	})
	if p := scalar(t, s.paymentsDB, "SELECT count(*) FROM payments"); p != 1000 {
		t.Errorf("%d payments for 1000 orders", p)
	}
	if settle != nil {
		settle(t, s)
	}
	kittest.Eventually(t, time.Minute, "6 dead letters and empty work and retry queues", func() (bool, error) {
		return queueDepth(t, s.amqpURL, "payments.order-placed.dlq") == 6 &&
			queueDepth(t, s.amqpURL, "payments.order-placed") == 0 &&
			queueDepth(t, s.amqpURL, "payments.order-placed.retry.100ms") == 0 &&
			queueDepth(t, s.amqpURL, "payments.order-placed.retry.500ms") == 0, nil
	})
	if n := scalar(t, s.gatewayDB, "SELECT count(*) FROM charges WHERE state = 'completed'"); n > 1000 {
		t.Errorf("%d charges for 1000 orders", n)
	}
	if n := scalar(t, s.gatewayDB, "SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY order_id HAVING count(*) > 1) x"); n != 0 {
		t.Errorf("%d orders charged more than once", n)
	}
	if n := scalar(t, s.paymentsDB, "SELECT count(*) FROM inbox"); n != 1000 {
		t.Errorf("inbox rows = %d, want 1000 (one per distinct message id)", n)
	}
	dups := metric(t, s.serviceAddr, `consumer_messages_total{consumer="payment-service",outcome="duplicate"}`)
	if dups != summary.Duplicates {
		t.Errorf("duplicates counted %d, published %d", dups, summary.Duplicates)
	}

	s.service.signal(t, syscall.SIGTERM)
	if code := s.service.wait(t, time.Minute); code != 0 {
		t.Fatalf("payment-service exited %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(s.service.out.String(), "stopped cleanly") {
		t.Error("no clean-stop log line")
	}
	s.assertVerify(t, summaryPath, 0, "PASS: every invariant holds")

	// Break the invariants behind the service's back: verify must notice.
	execSQL(t, s.gatewayDB, `INSERT INTO charges (id, idempotency_key, request_sha256, order_id, customer_id, amount_cents, currency, state, status)
		SELECT 'ch_twice', 'random-key-per-attempt', request_sha256, order_id, customer_id, amount_cents, currency, state, status
		FROM charges ORDER BY order_id LIMIT 1`)
	execSQL(t, s.paymentsDB, `DELETE FROM payments WHERE order_id = (SELECT max(order_id) FROM payments)`)
	out = s.assertVerify(t, summaryPath, 1, "FAIL: an invariant is broken")
	for _, want := range []string{"FAIL  nothing lost", "FAIL  no order charged twice"} {
		if !strings.Contains(out, want) {
			t.Errorf("verify did not report %q:\n%s", want, out)
		}
	}
}

// assertVerify runs inboxctl verify on the stack and checks its exit code and verdict.
func (s *stack) assertVerify(t *testing.T, summaryPath string, wantCode int, wantVerdict string) string {
	t.Helper()
	code, out := run(t, time.Minute, "inboxctl", []string{
		"AMQP_URL=" + s.amqpURL, "DATABASE_URL=" + s.paymentsDB, "GATEWAY_DATABASE_URL=" + s.gatewayDB,
		"RETRY_DELAYS=100ms,500ms", "GATEWAY_IN_FLIGHT_TIMEOUT=" + inFlightWindow,
	}, "verify", "--summary", summaryPath)
	if code != wantCode || !strings.Contains(out, wantVerdict) {
		t.Fatalf("inboxctl verify: exit %d, want %d with %q:\n%s", code, wantCode, wantVerdict, out)
	}
	return out
}

// metric reads one sample from the service's /metrics.
func metric(t *testing.T, addr, series string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(regexp.QuoteMeta(series) + ` (\d+)`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	var n int
	_ = json.Unmarshal(m[1], &n)
	return n
}

func TestBadConfigurationFailsAtStartNamingTheVariable(t *testing.T) {
	tests := []struct {
		env, variable string
	}{
		{"PREFETCH=lots", "PREFETCH"},
		{"WORKERS=64", "WORKERS"}, // more than PREFETCH (32)
		{"AMQP_URL=http://localhost", "AMQP_URL"},
		{"RETRY_DELAYS=1s,-1s", "RETRY_DELAYS"},
		{"HANDLER_TIMEOUT=1s", "HANDLER_TIMEOUT"},           // not above GATEWAY_TIMEOUT
		{"RETRY_DELAYS=100ms", "GATEWAY_IN_FLIGHT_TIMEOUT"}, // the retries end inside the gateway's 30s
		{"IDEMPOTENCY_KEY_TTL=2m", "IDEMPOTENCY_KEY_TTL"},   // the default retries may take 2m21s
		{"LOG_LEVEL=loud", "LOG_LEVEL"},
	}
	for _, tt := range tests {
		t.Run(tt.variable, func(t *testing.T) {
			code, out := run(t, 30*time.Second, "payment-service", []string{tt.env})
			if code == 0 || !strings.Contains(out, tt.variable) {
				t.Fatalf("exit %d, output %q: want a failure naming %s", code, out, tt.variable)
			}
		})
	}
}

func TestMigrateFromTwoProcessesAtOnce(t *testing.T) {
	db := kittest.Postgres(t)
	env := []string{"DATABASE_URL=" + db}
	a := start(t, "inboxctl", env, "migrate")
	b := start(t, "inboxctl", env, "migrate")
	if ca, cb := a.wait(t, time.Minute), b.wait(t, time.Minute); ca != 0 || cb != 0 {
		t.Fatalf("exit codes %d and %d:\n%s\n%s", ca, cb, a.out.String(), b.out.String())
	}
	if n := scalar(t, db, "SELECT count(*) FROM information_schema.tables WHERE table_name IN ('inbox', 'payments')"); n != 2 {
		t.Fatalf("%d of the 2 tables exist", n)
	}
	code, out := run(t, time.Minute, "inboxctl", env, "migrate")
	if code != 0 || !strings.Contains(out, "applied now: []") {
		t.Fatalf("third migrate: exit %d, %q", code, out)
	}
}

// column is the first column of every row of sql, as text.
func column(t *testing.T, url, sql string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}
