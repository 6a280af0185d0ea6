package servicetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/ops"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/internal/servicetest"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// A ledger service: one row per entry, whatever the message id.
var ledgerSchema = migrations.NewSet("ledger", fstest.MapFS{"00001_ledger.sql": {Data: []byte(
	"-- +goose Up\nCREATE TABLE ledger (entry text PRIMARY KEY, amount bigint NOT NULL);\n-- +goose Down\nDROP TABLE ledger;\n")}})

type entry struct {
	Entry  string `json:"entry"`
	Amount int64  `json:"amount"`
}

var (
	reasonMalformedEntry = consumer.NewReason("malformed_entry")
	reasonNegativeAmount = consumer.NewReason("negative_amount")
)

func ledgerHandler(_ context.Context, msg consumer.Message) (consumer.Writes, error) {
	var e entry
	if err := json.Unmarshal(msg.Body, &e); err != nil || e.Entry == "" {
		return nil, consumer.Permanent(reasonMalformedEntry, fmt.Errorf("entry: %v", err))
	}
	if e.Amount < 0 {
		return nil, consumer.Permanent(reasonNegativeAmount, errors.New("a ledger entry is never negative"))
	}
	return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		res := tx.WithContext(ctx).Exec(`INSERT INTO ledger (entry, amount) VALUES (?, ?) ON CONFLICT (entry) DO NOTHING`, e.Entry, e.Amount)
		if res.Error != nil {
			return "", res.Error
		}
		if res.RowsAffected == 0 {
			return consumer.OutcomeDuplicate, nil
		}
		return consumer.OutcomeProcessed, nil
	}, nil
}

func ledger() service.Options {
	return service.Options{
		Name: "ledger", Event: "entry-made", Exchange: "ledger", RoutingKey: "entry.made",
		Migrations:     []migrations.Set{ledgerSchema},
		NoOutsideCalls: true,
		OrderingKey:    service.JSONField("entry"),
		NewHandler: func(*service.Kit) (consumer.Handler, error) {
			return consumer.HandlerFunc(ledgerHandler), nil
		},
	}
}

func body(e string, amount int64) []byte {
	return fmt.Appendf(nil, `{"entry":%q,"amount":%d}`, e, amount)
}

// Start runs the service for real: a duplicate by message id and by entry
// are both suppressed, and a poison message is dead-lettered (inline) or
// parked (buffered) with its reason.
func TestStackRunsTheServiceOnTheRealBrokerAndDatabase(t *testing.T) {
	for _, mode := range []string{service.ModeInline, service.ModeBuffered} {
		t.Run(mode, func(t *testing.T) {
			s := servicetest.Start(t, ledger(), "INBOX_MODE="+mode)
			s.Publish(
				amqp.Publishing{MessageId: "m-1", Body: body("e-1", 10)},
				amqp.Publishing{MessageId: "m-1", Body: body("e-1", 10)}, // the producer's duplicate
				amqp.Publishing{MessageId: "m-2", Body: body("e-1", 10)}, // the same entry under a new id
				amqp.Publishing{MessageId: "m-3", Body: body("e-2", -5)},
			)
			s.WaitOutcome(consumer.OutcomeProcessed, 1)
			s.WaitOutcome(consumer.OutcomeDuplicate, 2)
			if mode == service.ModeBuffered {
				// The buffered mode acked it when it stored it: it parks it.
				s.WaitOutcome(consumer.OutcomeParked, 1)
				if n := s.Count("SELECT count(*) FROM inbox_messages WHERE status = 'parked' AND park_reason = 'negative_amount'"); n != 1 {
					t.Errorf("%d parked negative_amount, want 1", n)
				}
			} else {
				dead := map[string]string{}
				testenv.Eventually(t, 30*time.Second, "the negative entry dead-lettered", func() (bool, error) {
					for id, reason := range s.DeadLetters() {
						dead[id] = reason
					}
					return len(dead) > 0, nil
				})
				if len(dead) != 1 || dead["m-3"] != "negative_amount" {
					t.Errorf("dead letters %v, want m-3 negative_amount", dead)
				}
			}
			if n := s.Count("SELECT count(*) FROM ledger"); n != 1 {
				t.Errorf("%d ledger rows, want 1", n)
			}
			if got := s.Outcome(consumer.OutcomeProcessed); got != 1 {
				t.Errorf("%d processed, want 1", got)
			}
		})
	}
}

// CheckWrites runs the writes once rolled back and once committed: good
// writes give the same outcome both times and commit once; writes that
// count give themselves away.
func TestCheckWritesRunsTheWritesTwice(t *testing.T) {
	db, _ := testenv.MigratedDB(t, ledgerSchema)
	msg := consumer.Message{ID: "m-1", Body: body("e-1", 10)}
	out, err := servicetest.CheckWrites(t, db, consumer.HandlerFunc(ledgerHandler), msg)
	if err != nil || out != consumer.OutcomeProcessed {
		t.Fatalf("CheckWrites = %q, %v; want processed", out, err)
	}
	var n int64
	if err := db.Table("ledger").Count(&n).Error; err != nil || n != 1 {
		t.Fatalf("%d ledger rows (%v), want the committed run's 1", n, err)
	}
	if out, _ := servicetest.CheckWrites(t, db, consumer.HandlerFunc(ledgerHandler), msg); out != consumer.OutcomeDuplicate {
		t.Errorf("again: %q, want duplicate", out)
	}
	if _, err := servicetest.CheckWrites(t, db, consumer.HandlerFunc(ledgerHandler), consumer.Message{ID: "m-2", Body: body("e-2", -1)}); !isReason(err, "negative_amount") {
		t.Errorf("a refused message: err %v, want negative_amount", err)
	}

	// Writes that count in memory: the second run differs from the first.
	runs := 0
	counting := consumer.HandlerFunc(func(context.Context, consumer.Message) (consumer.Writes, error) {
		return func(context.Context, *gorm.DB) (consumer.Outcome, error) {
			runs++
			if runs > 1 {
				return consumer.OutcomeDuplicate, nil
			}
			return consumer.OutcomeProcessed, nil
		}, nil
	})
	r := &testenv.Recorder{TB: t}
	servicetest.CheckWrites(r, db, counting, consumer.Message{ID: "m-3"})
	if len(r.Errors) != 1 || !strings.Contains(r.Errors[0], `gave "processed", then "duplicate"`) {
		t.Errorf("counting writes: reported %q, want one report of the two outcomes", r.Errors)
	}
}

func isReason(err error, reason string) bool {
	var pe *consumer.PermanentError
	return errors.As(err, &pe) && pe.Reason.String() == reason
}

// From an outside review: each of these failed before its fix.

// Each Start sees only the variables it is given: the first Start's
// INBOX_MODE used to leak into the second.
func TestStartIsolatesEachServiceFromTheEnvironment(t *testing.T) {
	t.Setenv("INBOX_MODE", "buffered") // the developer's shell
	first := servicetest.Start(t, ledger(), "INBOX_MODE=buffered", "PREFETCH=150")
	first.Stop()
	second := servicetest.Start(t, ledger())
	if second.Config.InboxMode != service.ModeInline || second.Config.Prefetch != 192 {
		t.Errorf("second Start: INBOX_MODE %q, PREFETCH %d; want the defaults inline and 192", second.Config.InboxMode, second.Config.Prefetch)
	}
}

// The Stack's URLs are the ones the service runs with, an override included:
// Count used to read the test's own database while the service wrote another.
func TestStackFollowsTheOverriddenURLs(t *testing.T) {
	db := testenv.Postgres(t)
	s := servicetest.Start(t, ledger(), "DATABASE_URL="+db)
	if s.DBURL != db || s.Config.URL != db {
		t.Fatalf("Stack.DBURL %s, service on %s; want both %s", s.DBURL, s.Config.URL, db)
	}
	s.Publish(amqp.Publishing{MessageId: "m-1", Body: body("e-1", 1)})
	s.WaitOutcome(consumer.OutcomeProcessed, 1)
	if n := s.Count("SELECT count(*) FROM ledger"); n != 1 {
		t.Errorf("Count sees %d ledger rows in the service's database, want 1", n)
	}
}

// A panic of the handler or of the writes comes back as an error, as the
// runtime contains it, and the writes' transaction is rolled back.
func TestCheckWritesContainsPanics(t *testing.T) {
	db, _ := testenv.MigratedDB(t, ledgerSchema)
	panicking := map[string]consumer.Handler{
		"handler": consumer.HandlerFunc(func(context.Context, consumer.Message) (consumer.Writes, error) { panic("boom") }),
		"writes": consumer.HandlerFunc(func(context.Context, consumer.Message) (consumer.Writes, error) {
			return func(context.Context, *gorm.DB) (consumer.Outcome, error) { panic("boom") }, nil
		}),
	}
	for name, h := range panicking {
		if _, err := servicetest.CheckWrites(t, db, h, consumer.Message{ID: "m"}); err == nil || !strings.Contains(err.Error(), "panicked: boom") {
			t.Errorf("%s panic: err %v", name, err)
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if n := sqlDB.Stats().InUse; n != 0 {
		t.Errorf("%d connections in use: a transaction was left open", n)
	}
}

// A service with no outside calls replays a dead letter of any age, unknown
// included; it used to be refused as "too old" with a warning of repeated
// side effects the service cannot have.
func TestReplayWithoutOutsideCallsHasNoAgeLimit(t *testing.T) {
	s := servicetest.Start(t, ledger())
	s.Stop()
	// No timestamp, no dead-lettering time: of unknown age.
	testenv.Publish(t, s.AMQPURL, "", s.Config.DeadLetterQueue, amqp.Publishing{MessageId: "old", Body: body("e-9", 1)})
	var list bytes.Buffer
	if err := ops.Run(context.Background(), ledger(), []string{"dlq", "list", "--json"}, nil, &list); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list.String(), `"replay_max_age_seconds": null`) || strings.Contains(list.String(), `"too_old": true`) {
		t.Errorf("dlq list --json: want no age limit and nothing too old:\n%s", list.String())
	}
	// The list has given the dead letter back, ready, before it returned.
	var out bytes.Buffer
	if err := ops.Run(context.Background(), ledger(), []string{"dlq", "replay", "--all"}, nil, &out); err != nil || !strings.Contains(out.String(), "1 replayed") {
		t.Errorf("dlq replay --all: %v\n%s", err, out.String())
	}
}

// A handler is handed no pool (it writes only through its writes' tx) but a
// Reader; the service's background tasks get the pool.
func TestHandlersGetAReaderAndNoPool(t *testing.T) {
	opts := ledger()
	var handlerKit, taskKit *service.Kit
	opts.NewHandler = func(k *service.Kit) (consumer.Handler, error) {
		handlerKit = k
		return consumer.HandlerFunc(ledgerHandler), nil
	}
	opts.Tasks = func(k *service.Kit) ([]service.Task, error) {
		taskKit = k
		return nil, nil
	}
	s := servicetest.Start(t, opts)
	if handlerKit == nil || handlerKit.DB != nil {
		t.Fatalf("the handler's Kit has a pool: %v", handlerKit)
	}
	if taskKit == nil || taskKit.DB == nil {
		t.Fatalf("the tasks' Kit has no pool")
	}
	s.Publish(amqp.Publishing{MessageId: "m-1", Body: body("e-1", 7)})
	s.WaitOutcome(consumer.OutcomeProcessed, 1)
	var amount int64
	if err := handlerKit.Reader.Read(context.Background(), func(tx *gorm.DB) error {
		return tx.Raw(`SELECT amount FROM ledger WHERE entry = 'e-1'`).Scan(&amount).Error
	}); err != nil || amount != 7 {
		t.Errorf("the handler's Reader read %d (%v), want 7", amount, err)
	}
}

// A service that emits through its outbox: Bind and Take read what its relay
// published, each event once, its outbox id as the message id.
func TestEventsReadWhatTheServicePublished(t *testing.T) {
	opts := ledger()
	opts.Publishes = []string{"ledger-events"}
	opts.NewHandler = func(k *service.Kit) (consumer.Handler, error) {
		return consumer.HandlerFunc(func(ctx context.Context, msg consumer.Message) (consumer.Writes, error) {
			w, err := ledgerHandler(ctx, msg)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
				out, err := w(ctx, tx)
				if err != nil || out != consumer.OutcomeProcessed {
					return out, err
				}
				_, err = k.Outbox.Enqueue(ctx, tx, outbox.Message{Exchange: "ledger-events", RoutingKey: "entry.recorded", Body: msg.Body})
				return out, err
			}, nil
		}), nil
	}
	s := servicetest.Start(t, opts)
	events := s.Bind("ledger-events", "#")
	s.Publish(amqp.Publishing{MessageId: "m-1", Body: body("e-1", 1)}, amqp.Publishing{MessageId: "m-2", Body: body("e-1", 1)},
		amqp.Publishing{MessageId: "m-3", Body: body("e-2", 2)})
	got := events.Take(2)
	ids := map[string]bool{}
	for _, d := range got {
		ids[d.MessageId] = true
		if d.RoutingKey != "entry.recorded" {
			t.Errorf("event routed %q", d.RoutingKey)
		}
	}
	if len(ids) != 2 {
		t.Errorf("events %v: want two with distinct ids (the duplicate entry emits nothing)", ids)
	}
	// The relay marks its rows after the broker's confirm, which may come
	// after the events are in the queue.
	testenv.Eventually(t, 30*time.Second, "both outbox rows marked sent", func() (bool, error) {
		return s.Count("SELECT count(*) FROM outbox WHERE status = 'sent'") == 2, nil
	})
}

// /metrics carries the gauges the alert rules read (deploy/prometheus/rules):
// each readiness check, the pause and the stall of the consumer.
func TestMetricsCarryTheAlertsGauges(t *testing.T) {
	s := servicetest.Start(t, ledger())
	resp, err := http.Get("http://" + s.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	name := s.Config.Consumer
	for _, want := range []string{
		`service_readiness{check="consumer"} 1`, `service_readiness{check="database"} 1`,
		`consumer_paused{consumer="` + name + `"} 0`, `consumer_stalled_seconds{consumer="` + name + `"} 0`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// With FAULTS_TOKEN, the running service's fault endpoints refuse a caller
// without it (401) and arm for one with it.
func TestFaultEndpointsRequireTheToken(t *testing.T) {
	s := servicetest.Start(t, ledger(), "FAULTS_ENABLED=true", "FAULTS_TOKEN=let-me-crash-it")
	post := func(auth string) int {
		req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr+"/faults/crash?at=after-ack", nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	if code := post("Bearer guess"); code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", code)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+s.Addr+"/faults/crash", nil)
	req.Header.Set("Authorization", "Bearer let-me-crash-it")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE with the token: %d, want 204", resp.StatusCode)
	}
	if strings.Contains(s.Logs.String(), "let-me-crash-it") {
		t.Error("the token is in the logs")
	}
}

// A service applies its schemas at start with the migrate command's
// statement timeout, not DB_STATEMENT_TIMEOUT: a migration longer than the
// sessions' timeout (the buffered set's 00003 on a large backlog) would be
// rolled back at every start, and the service would never come up.
func TestStartAppliesAMigrationLongerThanTheStatementTimeout(t *testing.T) {
	slow := ledger()
	slow.Migrations = append(slow.Migrations, migrations.NewSet("slow", fstest.MapFS{"00001_slow.sql": {Data: []byte(
		"-- +goose Up\nSELECT pg_sleep(3);\n-- +goose Down\nSELECT 1;\n")}}))
	s := servicetest.Start(t, slow, "DB_STATEMENT_TIMEOUT=1s")
	s.Publish(amqp.Publishing{MessageId: "m-1", Body: body("e-1", 1)})
	s.WaitOutcome(consumer.OutcomeProcessed, 1)
}
