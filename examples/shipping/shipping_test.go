package shipping_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/consumer"
	"github.com/inbox-template/payment-service/internal/faults"
	"github.com/inbox-template/payment-service/internal/rabbit"
	"github.com/inbox-template/payment-service/internal/testenv"
)

// binary is the built example service, shared by the tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shipping-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "shipping-service")
	build := exec.Command("go", "build", "-o", binary, "./cmd/shipping-service")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build shipping-service:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// carrier is a pickup API with idempotency keys: the same key gets the stored
// answer; it counts the pickups it really booked.
type carrier struct {
	mu      sync.Mutex
	booked  map[string]string // key → pickup id
	replays int
}

func (c *carrier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var p struct {
		OrderID string `json:"order_id"`
	}
	if key == "" || json.NewDecoder(r.Body).Decode(&p) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	id, ok := c.booked[key]
	if ok {
		c.replays++
	} else {
		id = "pickup-" + p.OrderID
		c.booked[key] = id
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"pickup_id":%q}`, id)
}

func (c *carrier) counts() (booked, replays int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.booked), c.replays
}

// stack is a vhost, a database, the carrier and the running service.
type stack struct {
	amqpURL, dbURL, addr string
	carrier              *carrier
	carrierURL           string
	cmd                  *exec.Cmd
	out                  *testenv.Buffer
	done                 chan struct{}
}

func startStack(t *testing.T) *stack {
	t.Helper()
	c := &carrier{booked: map[string]string{}}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	s := &stack{amqpURL: testenv.VHost(t), dbURL: testenv.Postgres(t), addr: testenv.FreeAddr(t), carrier: c, carrierURL: srv.URL}
	s.start(t)
	return s
}

// start runs the service as a process, as its main would run in production.
func (s *stack) start(t *testing.T) {
	t.Helper()
	s.out, s.done = &testenv.Buffer{}, make(chan struct{})
	s.cmd = exec.Command(binary)
	s.cmd.Env = append(os.Environ(), "AMQP_URL="+s.amqpURL, "DATABASE_URL="+s.dbURL, "HTTP_ADDR="+s.addr,
		"CARRIER_URL="+s.carrierURL, "RETRY_DELAYS=100ms,500ms", "FAULTS_ENABLED=true")
	s.cmd.Env = append(s.cmd.Env, testenv.GroupCommitVars()...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
		if t.Failed() {
			t.Logf("--- shipping-service output:\n%s", s.out)
		}
	})
	testenv.Eventually(t, time.Minute, "shipping-service ready", func() (bool, error) {
		resp, err := http.Get("http://" + s.addr + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// publish sends OrderPaid events with confirms to the exchange the service binds.
func (s *stack) publish(t *testing.T, msgs ...amqp.Publishing) {
	t.Helper()
	testenv.WithChannel(t, s.amqpURL, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		for _, m := range msgs {
			m.ContentType, m.DeliveryMode = "application/json", amqp.Persistent
			if err := rabbit.PublishConfirmed(context.Background(), ch, "payments", "order.paid", m); err != nil {
				return err
			}
		}
		return nil
	})
}

func paid(id, order string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, `{"event_id":%q,"order_id":%q,"address":"1 Main St"}`, id, order)}
}

func (s *stack) count(t *testing.T, sql string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Duplicates (same message id), the same order under a new message id and a
// poison message: one shipment and one booking per order, the poison in the
// derived dead-letter queue with its reason.
func TestShipsEachOrderOnce(t *testing.T) {
	s := startStack(t)
	var msgs []amqp.Publishing
	for i := range 20 {
		order := fmt.Sprintf("o-%d", i)
		msgs = append(msgs, paid("m-"+order, order), paid("m-"+order, order)) // a producer's duplicate
		if i < 5 {
			msgs = append(msgs, paid("again-"+order, order)) // the same order, a new message id
		}
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "poison", Body: []byte(`{"order_id":`)})
	s.publish(t, msgs...)

	testenv.Eventually(t, time.Minute, "20 shipments and the poison dead-lettered", func() (bool, error) {
		return s.count(t, "SELECT count(*) FROM shipments") == 20 &&
			testenv.QueueDepth(t, s.amqpURL, "shipping-service.order-paid.dlq") == 1 &&
			testenv.QueueDepth(t, s.amqpURL, "shipping-service.order-paid") == 0, nil
	})
	if booked, _ := s.carrier.counts(); booked != 20 {
		t.Errorf("%d pickups booked for 20 orders", booked)
	}
	if n := s.count(t, "SELECT count(*) FROM inbox WHERE consumer = 'shipping-service'"); n != 25 {
		t.Errorf("%d inbox rows, want 25 (one per message id but the poison)", n)
	}
	// The service's own operations commands, from its own configuration.
	list := exec.Command(binary, "dlq", "list")
	list.Env = s.cmd.Env
	out, err := list.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "shipping-service.order-paid.dlq: 1 messages") || !strings.Contains(string(out), "malformed_json") {
		t.Errorf("shipping-service dlq list: %v\n%s", err, out)
	}
	testenv.WithChannel(t, s.amqpURL, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get("shipping-service.order-paid.dlq", true)
		if err == nil && (!ok || d.MessageId != "poison" || d.Headers[consumer.HeaderDeadLetterReason] != "malformed_json") {
			t.Errorf("dead letter %q with reason %v, want poison with malformed_json", d.MessageId, d.Headers[consumer.HeaderDeadLetterReason])
		}
		return err
	})
}

// The service's own crash point: the process dies after the carrier booked
// the pickup and before anything was committed; after a restart the redelivery
// books with the same key and the carrier replays its answer.
func TestCrashAfterCarrierBook(t *testing.T) {
	s := startStack(t)
	resp, err := http.Post("http://"+s.addr+"/faults/crash?at=after-carrier-book", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("arming answered %d", resp.StatusCode)
	}
	var msgs []amqp.Publishing
	for i := range 10 {
		msgs = append(msgs, paid(fmt.Sprintf("c-%d", i), fmt.Sprintf("co-%d", i)))
	}
	s.publish(t, msgs...)
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatal("the armed service did not die")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != faults.ExitCode {
		t.Fatalf("exit status %d, want %d of a crash point", code, faults.ExitCode)
	}
	if !strings.Contains(s.out.String(), "crash point after-carrier-book") {
		t.Fatal("the process did not die at after-carrier-book")
	}
	s.start(t)
	testenv.Eventually(t, time.Minute, "10 shipments after the restart", func() (bool, error) {
		return s.count(t, "SELECT count(*) FROM shipments") == 10, nil
	})
	booked, replays := s.carrier.counts()
	if booked != 10 || replays < 1 {
		t.Fatalf("%d booked, %d replays: want 10 bookings, the crashed one replayed", booked, replays)
	}
}
