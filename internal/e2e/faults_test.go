package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/demo/producer"
	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/kittest/faultkit"
)

// paymentService is the payment service's binary, as the fault kit runs it.
var paymentService = kittest.NewProgram("../../cmd/payment-service")

// The fault kit's scenarios against the payment service: the kit's crash
// points, the outbox relay's (after-outbox-publish: published, confirmed,
// not yet marked sent) and its own (after-gateway-charge), replicas killed, connections
// dropped, database sessions terminated, each under the publisher's load
// with duplicates and poison; then inboxctl verify: nothing lost, no order
// charged twice, only the poison dead-lettered.
//
// Then the payment service's own scenarios: the gateway losing responses
// after it charged, a burst of poison before the orders, a producer that
// sends every other order twice. They test the handler and the inbox, not
// the mode, so they run in the inline mode only.
//
// The test and its buffered twin run side by side (t.Parallel: none of their
// scenarios disturbs the whole broker), so that the trials of both modes and
// the generator's tests share make test-scenarios' slots (-parallel): one
// after the other, each mode's last wave left slots idle, and the
// generator's tests ran alone.
func TestPaymentUnderFaults(t *testing.T) {
	t.Parallel()
	scenarios := append(faultkit.Scenarios("after-gateway-charge", "after-outbox-publish"),
		gatewayLosesResponses, poisonBurst, producerRepublishes)
	faultkit.Run(t, scenarios, paymentTrial(nil))
}

// gatewayLosesResponses is the gateway-lost-responses scenario: the fake
// gateway stores 30% of the charges and drops the connection without an
// answer. The service cannot know whether the card was charged: it retries
// with the same Idempotency-Key and gets the stored result (the trial's
// Verify counts the replays).
var gatewayLosesResponses = faultkit.Scenario{
	Name:      "gateway-lost-responses",
	Replicas:  1,
	FixedLoad: true, // the fault lasts as long as the load
	Fault: func(s *faultkit.Stack, busy func() bool) {
		gw := s.Getenv("GATEWAY_URL")
		gatewayFaults(s.T(), gw, `{"lost_response_rate":0.3}`)
		s.SuperviseWhile(5*time.Minute, "publishing the load", busy)
		s.SuperviseFor(3 * time.Second)
		gatewayFaults(s.T(), gw, `{"lost_response_rate":0}`)
		s.Note("the fake gateway dropped 30%% of its responses after storing the charge while the load was published")
	},
	Check: func(t testing.TB, s *faultkit.Stack) {
		if n := s.MetricSum("consumer_messages_total", "outcome", "retried"); n == 0 {
			t.Errorf("the service never retried while the gateway lost 30%% of its responses")
		}
	},
}

// poisonBurst is the poison-burst scenario: 50 poison messages at once (one
// of every kind the publisher knows, in turn), then 300 valid orders. Each
// poison message is dead-lettered once with its reason (inboxctl verify
// counts them by reason) and the same process, never restarted, pays every
// order after the burst.
var poisonBurst = faultkit.Scenario{
	Name:     "poison-burst",
	Replicas: 1,
	Fault: func(s *faultkit.Stack, busy func() bool) {
		s.Note("a burst of 50 poison messages, then 300 valid orders")
	},
	Check: func(t testing.TB, s *faultkit.Stack) {
		if s.Restarts != 0 {
			t.Errorf("the service was started again %d times: poison must not crash it", s.Restarts)
		}
		if n := s.MetricSum("consumer_messages_total", "outcome", "dead_lettered"); n != 50 {
			t.Errorf("the service dead-lettered %v messages, want the 50 of the burst", n)
		}
	},
}

// producerRepublishes is the producer-republishes scenario: half of the
// orders are sent twice with the same message id (a retry after a lost
// confirm), half again under a new message id (a producer that emits the
// event again). The inbox key catches the first, the unique order_id of
// payments the second; the trial's Verify counts them.
var producerRepublishes = faultkit.Scenario{
	Name:     "producer-republishes",
	Replicas: 1,
	Fault: func(s *faultkit.Stack, busy func() bool) {
		s.Note("half of the orders sent twice, half again under a new message id")
	},
}

// paymentLoads is what a scenario publishes, as order-publisher's flags, one
// run after the other; the others publish paymentLoad.
var (
	paymentLoad  = []string{"-count", "300", "-duplicate-rate", "0.1", "-republish-rate", "0.05", "-poison", "3", "-rate", "35"}
	paymentLoads = map[string][][]string{
		"poison-burst":         {{"-count", "0", "-poison", "50"}, {"-count", "300", "-duplicate-rate", "0.1", "-rate", "100"}},
		"producer-republishes": {{"-count", "300", "-duplicate-rate", "0.5", "-republish-rate", "0.5", "-rate", "100"}},
		// Long enough for two broker restarts under load.
		"broker-restart": {{"-count", "600", "-duplicate-rate", "0.1", "-poison", "3", "-rate", "40"}},
		// Published while the replica is held: the faster the better.
		"broker-stop-outbox-backlog": {{"-count", "300", "-duplicate-rate", "0.1", "-rate", "150"}},
	}
)

// gatewayFaults sets the fake gateway's fault rates (POST /faults).
func gatewayFaults(t testing.TB, gatewayURL, body string) {
	t.Helper()
	resp, err := http.Post(gatewayURL+"/faults", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s/faults: %v", gatewayURL, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s/faults %s: %s", gatewayURL, body, resp.Status)
	}
}

// The same with the buffered inbox.
func TestPaymentUnderFaultsBuffered(t *testing.T) {
	t.Parallel()
	faultkit.Run(t, faultkit.BufferedScenarios("after-gateway-charge", "after-outbox-publish"), paymentTrial(bufferedFaultEnv))
}

// bufferedFaultEnv is the buffered mode with its retry delays scaled down.
var bufferedFaultEnv = []string{
	"INBOX_MODE=buffered", "BUFFER_RETRY_DELAYS=200ms,1s,2s", "BUFFER_MAX_ATTEMPTS=30",
	"HANDLER_TIMEOUT=2s", "GATEWAY_TIMEOUT=1s",
}

// faultSink stands for the shipping service's queue: the OrderPaid events
// the outbox relays are routed there (nobody reads them in these tests).
const faultSink = "faults.order-paid"

// loadMore and clusterLoadMore are a batch of the load's extension while
// the fault's rounds remain (faultkit.Trial.LoadMore): 2 s at the load's
// rate, about 11 s at the cluster load's (the rate counts duplicates).
var (
	loadMore        = []string{"-count", "70", "-duplicate-rate", "0.1", "-rate", "35", "-timeout", "5m"}
	clusterLoadMore = []string{"-count", "500", "-duplicate-rate", "0.1", "-rate", "50", "-timeout", "5m"}
)

// paymentTrial is a fresh run of the payment service with env for sc: its
// publisher runs load (one run each, in turn), or by default the
// scenario's paymentLoads.
func paymentTrial(env []string, load ...[]string) func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
	return func(t *testing.T, sc faultkit.Scenario) *faultkit.Trial {
		var cluster *kittest.Cluster
		var amqpURL string
		if sc.OnCluster {
			cluster = kittest.NewSharedCluster(t) // the modes' runs side by side, one kill at a time
			amqpURL = cluster.URL()
		} else {
			amqpURL = kittest.VHost(t)
		}
		paymentsDB, gatewayDB := kittest.Postgres(t), kittest.Postgres(t)
		gatewayAddr := kittest.FreeAddr(t)
		gatewayEnv := []string{"DATABASE_URL=" + gatewayDB, "HTTP_ADDR=" + gatewayAddr, "IN_FLIGHT_TAKEOVER=" + inFlightWindow, "FAULTS_ENABLED=true"}
		if sc.OnCluster {
			// Node loss runs in both modes at once: PostgreSQL's 100
			// connections are for both. Its subject is the broker: each
			// gateway keeps 4. (Its replicas at DB_MAX_CONNS=8 left the
			// buffered mode undrained after 2 minutes in a fresh-clone run.)
			gatewayEnv = append(gatewayEnv, "STORE_MAX_CONNS=4")
		}
		start(t, "fake-gateway", gatewayEnv)
		waitHTTP(t, "http://"+gatewayAddr+"/healthz")
		func() {
			if cluster != nil {
				// Not while another mode's round holds a node down.
				end := cluster.Round()
				defer end()
			}
			kittest.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
				if err := ch.ExchangeDeclare("payments", "topic", true, false, false, false, nil); err != nil {
					return err
				}
				// A quorum queue: on a cluster, a classic one lives on one node,
				// and the events routed to it while that node is down are lost.
				if _, err := ch.QueueDeclare(faultSink, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
					return err
				}
				return ch.QueueBind(faultSink, "order.paid", "payments", false, nil)
			})
		}()
		s := faultkit.Start(t, faultkit.Config{
			Program: paymentService, Replicas: sc.Replicas, AMQPURL: amqpURL, DBURL: paymentsDB, Sinks: []string{faultSink}, Cluster: cluster,
			Env: append([]string{"GATEWAY_URL=http://" + gatewayAddr, "GATEWAY_IN_FLIGHT_TIMEOUT=" + inFlightWindow,
				"RETRY_DELAYS=200ms,1s,2s", "MAX_ATTEMPTS=8", "RECONNECT_MAX_WAIT=2s", "SHUTDOWN_TIMEOUT=5s",
				// A relay that crashed holding rows gives them up after its
				// lease: the shortest the relay takes.
				"OUTBOX_LEASE=16s"}, env...),
		})
		loads, ok := paymentLoads[sc.Name]
		if !ok {
			loads = [][]string{paymentLoad}
		}
		if len(load) > 0 {
			loads = load
		}
		var summaries []string
		for i := range loads {
			summaries = append(summaries, filepath.Join(t.TempDir(), fmt.Sprintf("summary-%d.json", i)))
		}
		publish := func(i int, args []string) error {
			code, out := run(t, 30*time.Minute, "order-publisher", []string{"AMQP_URL=" + amqpURL},
				append(args, "-run-id", fmt.Sprintf("%s-%d", sc.Name, i), "-summary", summaries[i])...)
			if code != 0 {
				return fmt.Errorf("order-publisher exited %d:\n%s", code, out)
			}
			return nil
		}
		// The fault's rounds (a node-loss round takes 19 s here, 45 s on a
		// loaded machine) find the load running: it goes on, a batch at a
		// time, until the last round is done.
		more := loadMore
		if sc.OnCluster {
			more = clusterLoadMore
		}
		publishMore := func() error {
			summaries = append(summaries, filepath.Join(t.TempDir(), fmt.Sprintf("summary-%d.json", len(summaries))))
			return publish(len(summaries)-1, more)
		}
		return &faultkit.Trial{
			Stack: s,
			Load: func() error {
				for i, args := range loads {
					if err := publish(i, args); err != nil {
						return err
					}
				}
				return nil
			},
			LoadMore: publishMore,
			Progress: func() int { return scalar(t, paymentsDB, "SELECT count(*) FROM payments") },
			Verify: func(t *testing.T) {
				args := []string{"verify"}
				for _, f := range summaries {
					args = append(args, "--summary", f)
				}
				code, out := run(t, time.Minute, "inboxctl", []string{
					"AMQP_URL=" + amqpURL, "DATABASE_URL=" + paymentsDB, "GATEWAY_DATABASE_URL=" + gatewayDB,
					"RETRY_DELAYS=200ms,1s,2s", "MAX_ATTEMPTS=8", "GATEWAY_IN_FLIGHT_TIMEOUT=" + inFlightWindow,
				}, args...)
				if code != 0 || !strings.Contains(out, "PASS: every invariant holds") {
					t.Errorf("inboxctl verify: exit %d\n%s", code, out)
				} else {
					t.Logf("inboxctl verify:\n%s", out)
				}
				// verify counts a valid order dead-lettered (retries spent, a
				// delivery limit) or parked as not lost: here only the poison
				// may end so. Every valid order has its payment (a decline is
				// one), and every valid message id its inbox row.
				// (The buffered ingest also keeps the key of a poison message it
				// stored before its processing refused it.)
				var orders, ids, poison int
				for _, f := range summaries {
					sum := readSummary(t, f)
					orders += sum.Orders
					ids += sum.Orders + sum.Republishes
					poison += sum.PoisonTotal
				}
				if n := scalar(t, paymentsDB, "SELECT count(*) FROM payments"); n != orders {
					t.Errorf("%d payments for %d valid orders published: a valid order was dead-lettered or parked", n, orders)
				}
				most := ids
				if slices.Contains(env, "INBOX_MODE=buffered") {
					most += poison
				}
				if n := scalar(t, paymentsDB, "SELECT count(*) FROM inbox WHERE consumer = 'payment-service'"); n < ids || n > most {
					t.Errorf("%d inbox rows for %d valid message ids published (and %d poison)", n, ids, poison)
				}
				// The outbox: every succeeded payment's OrderPaid reached the
				// broker, the same orders (at least once: a relay that crashed
				// between the confirm and marking the row sent publishes it
				// again).
				paid := strings.Join(column(t, paymentsDB, "SELECT order_id FROM payments WHERE status = 'succeeded' ORDER BY order_id"), ",")
				events, copies := sinkOrders(t, amqpURL, faultSink)
				if strings.Join(events, ",") != paid {
					t.Errorf("the OrderPaid events that reached %s are not those of the succeeded payments (%d orders against %d)",
						faultSink, len(events), strings.Count(paid, ",")+1)
				}
				switch sc.Name {
				case "crash-after-outbox-publish":
					// Confirmed, not marked sent: the relay published again.
					if copies <= len(events) {
						t.Errorf("%d events for %d orders: no event was published again after a crash between the confirm and marking it sent", copies, len(events))
					}
					s.Note("%d OrderPaid messages for %d orders: the relay published %d again after its crashes", copies, len(events), copies-len(events))
				case "crash-after-gateway-charge", "gateway-lost-responses":
					if n := scalar(t, gatewayDB, "SELECT coalesce(sum(replays), 0) FROM charges"); n == 0 {
						t.Errorf("%s: the gateway replayed no stored charge", sc.Name)
					}
				case "producer-republishes":
					sum := readSummary(t, summaries[0])
					sent := sum.Duplicates + sum.Republishes
					if n := s.MetricSum("consumer_messages_total", "outcome", "duplicate"); int(n) != sent || sent < 100 {
						t.Errorf("the service counted %v duplicates for %d sent again (%d duplicates, %d republishes)", n, sent, sum.Duplicates, sum.Republishes)
					}
					s.Note("%d duplicates and %d republishes sent, every one counted as a duplicate", sum.Duplicates, sum.Republishes)
				}
			},
		}
	}
}

// readSummary reads an order-publisher summary.
func readSummary(t testing.TB, path string) producer.Summary {
	t.Helper()
	var sum producer.Summary
	raw, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(raw, &sum)
	}
	if err != nil {
		t.Fatalf("summary %s: %v", path, err)
	}
	return sum
}

// sinkOrders takes every message of queue and returns the distinct order
// ids of their OrderPaid bodies, sorted, and how many messages there were.
func sinkOrders(t *testing.T, amqpURL, queue string) (orders []string, messages int) {
	t.Helper()
	seen := map[string]bool{}
	kittest.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				return err
			}
			messages++
			var ev struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(d.Body, &ev); err != nil || ev.OrderID == "" {
				t.Errorf("an OrderPaid event without an order id: %q (%v)", d.Body, err)
			}
			seen[ev.OrderID] = true
		}
	})
	for o := range seen {
		orders = append(orders, o)
	}
	slices.Sort(orders)
	return orders, messages
}
