// Package servicetest runs a service built on the kit inside its own tests,
// against the real broker and database, and checks its writes the way the
// runtime runs them:
//
//	func TestRefunds(t *testing.T) {
//		s := servicetest.Start(t, refunds.Service())
//		s.Publish(amqp.Publishing{MessageId: "m-1", Body: []byte(`{"order_id":"o-1"}`)})
//		s.WaitOutcome(consumer.OutcomeProcessed, 1)
//		if n := s.Count("SELECT count(*) FROM refunds"); n != 1 { … }
//	}
//
// Start runs the service in the test process through service.Run, so a
// test sees its logs, metrics and database, and its tests need no build
// step. A crash point ends the process it fires in: test crashes with
// testenv.Program, which runs the service's binary. Tests that use Start
// must not be parallel (it sets the environment with t.Setenv).
package servicetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/wire"
)

// Stack is one service running on a vhost and a database of its own.
type Stack struct {
	t       testing.TB
	AMQPURL string
	DBURL   string
	// Addr is the service's HTTP_ADDR: /readyz, /metrics, /faults.
	Addr string
	// Config is the configuration the service loaded.
	Config service.Config
	Logs   *testenv.Buffer
	stop   func()
}

// Start runs opts until the test ends, on a new vhost and a new database,
// with env (NAME=value) over the test defaults: retry delays of 100ms and
// 500ms, a 10s stop, the suite's group commit setting. Every other variable
// the service reads (the kit's and its Settings') is unset for it, so that
// neither the shell nor an earlier Start in the same test leaks into it. It
// returns once the service is ready. The service's logs are shown if the test
// fails. The Stack's URLs and address are the ones the service runs with, env
// included.
func Start(t testing.TB, opts service.Options, env ...string) *Stack {
	t.Helper()
	s := &Stack{t: t, Logs: &testenv.Buffer{}}
	vars := append([]string{
		"AMQP_URL=" + testenv.VHost(t), "DATABASE_URL=" + testenv.Postgres(t), "HTTP_ADDR=" + testenv.FreeAddr(t),
		"RETRY_DELAYS=100ms,500ms", "BUFFER_RETRY_DELAYS=100ms,500ms", "SHUTDOWN_TIMEOUT=10s", "LOG_LEVEL=info",
	}, testenv.GroupCommitVars()...)
	for _, v := range opts.Describe() {
		t.Setenv(v.Name, "") // restored when the test ends
		os.Unsetenv(v.Name)
	}
	for _, kv := range append(vars, env...) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("servicetest.Start: %q is not NAME=value", kv)
		}
		t.Setenv(k, v)
	}
	cfg, err := service.LoadConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Config = cfg
	s.AMQPURL, s.DBURL, s.Addr = cfg.AMQPURL, cfg.URL, cfg.HTTPAddr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, opts, nil, s.Logs) }()
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", opts.Name, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute", opts.Name)
		}
	}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("--- %s logs:\n%s", opts.Name, s.Logs)
		}
	})
	testenv.Eventually(t, time.Minute, opts.Name+" ready", func() (bool, error) {
		select {
		case err := <-done:
			stopped = true
			return false, fmt.Errorf("%s ended before it was ready: %v\n%s", opts.Name, err, s.Logs)
		default:
		}
		return ready(s.Addr), nil
	})
	return s
}

var probe = &http.Client{Timeout: 5 * time.Second}

// ready reports whether /readyz answers 200.
func ready(addr string) bool {
	resp, err := probe.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Stop stops the service now and waits for its graceful stop.
func (s *Stack) Stop() { s.stop() }

// Publish sends msgs to the exchange and routing key the service consumes,
// with confirms (persistent, JSON unless a content type is set).
func (s *Stack) Publish(msgs ...amqp.Publishing) {
	s.t.Helper()
	testenv.Publish(s.t, s.AMQPURL, s.Config.Exchange, s.Config.RoutingKey, msgs...)
}

// PublishTo sends msgs to the service's exchange with key: the events of a
// service that consumes several (kit.ConsumeAlso) each have their own.
func (s *Stack) PublishTo(key string, msgs ...amqp.Publishing) {
	s.t.Helper()
	testenv.Publish(s.t, s.AMQPURL, s.Config.Exchange, key, msgs...)
}

// PublishToExchange sends msgs to exchange with key: an event whose binding
// names an exchange of its own.
func (s *Stack) PublishToExchange(exchange, key string, msgs ...amqp.Publishing) {
	s.t.Helper()
	testenv.Publish(s.t, s.AMQPURL, exchange, key, msgs...)
}

// Outcome is how many messages the service settled with outcome so far
// (consumer_messages_total).
func (s *Stack) Outcome(outcome consumer.Outcome) int {
	s.t.Helper()
	return int(testenv.Metric(s.t, s.Addr, "consumer_messages_total", "outcome", string(outcome)))
}

// WaitOutcome waits until at least n messages were settled with outcome.
func (s *Stack) WaitOutcome(outcome consumer.Outcome, n int) {
	s.t.Helper()
	testenv.Eventually(s.t, time.Minute, fmt.Sprintf("%d messages %s", n, outcome), func() (bool, error) {
		return s.Outcome(outcome) >= n, nil
	})
}

// DeadLetters takes every message from the dead-letter queue and returns
// each one's reason by message id.
func (s *Stack) DeadLetters() map[string]string {
	s.t.Helper()
	out := map[string]string{}
	testenv.WithChannel(s.t, s.AMQPURL, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(s.Config.DeadLetterQueue, true)
			if err != nil || !ok {
				return err
			}
			reason, _ := d.Headers[wire.HeaderDeadLetterReason].(string)
			out[d.MessageId] = reason
		}
	})
	return out
}

// Events is a queue of the test's own, bound to an exchange the service
// publishes to (Options.Publishes): what its outbox relay published.
type Events struct {
	s     *Stack
	queue string
}

// Bind declares a queue bound to exchange with key ("#" for everything) and
// returns it; bind before publishing what makes the service emit. The queue
// goes with the test's vhost.
func (s *Stack) Bind(exchange, key string) *Events {
	s.t.Helper()
	ev := &Events{s: s, queue: testenv.Name("events")}
	testenv.WithChannel(s.t, s.AMQPURL, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(ev.queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(ev.queue, key, exchange, false, nil)
	})
	return ev
}

// Take waits until n events have arrived and returns them, taking them off
// the queue; it fails the test after a minute.
func (ev *Events) Take(n int) []amqp.Delivery {
	ev.s.t.Helper()
	var got []amqp.Delivery
	testenv.WithChannel(ev.s.t, ev.s.AMQPURL, func(ch *amqp.Channel) error {
		deadline := time.Now().Add(time.Minute)
		for len(got) < n {
			d, ok, err := ch.Get(ev.queue, true)
			switch {
			case err != nil:
				return err
			case ok:
				got = append(got, d)
			case time.Now().After(deadline):
				return fmt.Errorf("%d of %d events arrived within a minute", len(got), n)
			default:
				time.Sleep(20 * time.Millisecond)
			}
		}
		return nil
	})
	return got
}

// Waiting is how many events are in the queue now, not taken yet: after a
// Take and a pause, 0 shows that nothing more was emitted.
func (ev *Events) Waiting() int {
	ev.s.t.Helper()
	n := 0
	testenv.WithChannel(ev.s.t, ev.s.AMQPURL, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(ev.queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// Count runs a count query on the service's database.
func (s *Stack) Count(query string, args ...any) int {
	s.t.Helper()
	return testenv.Count(s.t, s.DBURL, query, args...)
}

// CheckWrites runs h on msg as the runtime does, with no transaction open,
// then its writes twice on db: first in a transaction that rolls back, then
// in one that commits. The runtime may run a message's writes more than
// once (a batch-mate failed, and the batch ran again), so both runs must
// give the same outcome and the same success; CheckWrites fails t if not,
// and if the writes return no outcome. What it cannot see is a side effect
// that leaves the outcome alone (a counter in memory, a call out): keep the
// writes to tx. It returns what the committed run gave, or the handler's
// error; a panic of either is returned as an error, as the runtime contains
// it. A handler that decodes its events with a Decoder gets msg as the
// runtime would hand it over: consumer.Decode(opts.Decoder, msg).
func CheckWrites(t testing.TB, db *gorm.DB, h consumer.Handler, msg consumer.Message) (consumer.Outcome, error) {
	t.Helper()
	ctx := context.Background()
	writes, err := handle(ctx, h, msg)
	if err != nil {
		return "", err
	}
	if writes == nil {
		t.Errorf("message %s: the handler returned no writes and no error: the runtime dead-letters such a message "+
			"(%s); return kit.NoWrites(outcome) for a message with nothing to write", msg.ID, wire.ReasonNoOutcome)
		return "", consumer.Permanent(consumer.ReasonNoOutcome, errors.New("no writes and no error"))
	}
	first, firstErr := runWrites(ctx, t, db, writes, false)
	out, err := runWrites(ctx, t, db, writes, true)
	switch {
	case (firstErr == nil) != (err == nil):
		t.Errorf("message %s: the writes failed in one run and not in the other (rolled back: %v; committed: %v): "+
			"they must depend on the database alone", msg.ID, firstErr, err)
	case first != out:
		t.Errorf("message %s: the writes gave %q, then %q after a rollback: they must do nothing but write through tx "+
			"(no counting, no calls out)", msg.ID, first, out)
	}
	if err == nil && out == "" {
		t.Errorf("message %s: the writes returned no outcome and no error: the runtime dead-letters such a message "+
			"(%s); return kit.OutcomeProcessed, kit.OutcomeDuplicate or an outcome of your own", msg.ID, wire.ReasonNoOutcome)
	}
	return out, err
}

// errPanicked is the error CheckWrites returns for a handler or writes that
// panicked (the runtime retries such a message, and counts the panic).
var errPanicked = errors.New("panicked")

// handle calls the handler, a panic turned into an error as the runtime does.
func handle(ctx context.Context, h consumer.Handler, msg consumer.Message) (w consumer.Writes, err error) {
	defer func() {
		if v := recover(); v != nil {
			w, err = nil, fmt.Errorf("handler %w: %v", errPanicked, v)
		}
	}()
	return h.Handle(ctx, msg)
}

// runWrites runs the writes in a transaction of their own that commits only
// if commit is set and they succeed; it rolls back otherwise, a panic of the
// writes included (returned as an error).
func runWrites(ctx context.Context, t testing.TB, db *gorm.DB, writes consumer.Writes, commit bool) (out consumer.Outcome, err error) {
	t.Helper()
	tx := db.WithContext(ctx).Begin()
	if tx.Error != nil {
		t.Fatal(tx.Error)
	}
	done := false
	defer func() {
		if v := recover(); v != nil {
			out, err = "", fmt.Errorf("writes %w: %v", errPanicked, v)
		}
		if !done {
			_ = tx.Rollback().Error
		}
	}()
	rctx, committed := consumer.CommitHooks(ctx)
	out, err = writes(rctx, tx)
	if !commit || err != nil {
		return out, err
	}
	done = true
	if err := tx.Commit().Error; err != nil {
		return out, fmt.Errorf("commit: %w", err)
	}
	committed()
	return out, nil
}
