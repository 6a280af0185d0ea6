package fakegateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/kittest"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// env is one Server over its own store, served by httptest.
type env struct {
	srv    *Server
	url    string
	probe  probe
	reg    *prometheus.Registry
	client *http.Client
}

// storeKind is one Store implementation under test, with the probe that reads
// its charges.
type storeKind struct {
	name string
	open func(t *testing.T) (Store, probe)
}

var (
	postgresStore = storeKind{"postgres", openPostgres}
	memoryStore   = storeKind{"memory", openMemory}
)

// eachStore runs test against every Store implementation: one contract, two stores.
func eachStore(t *testing.T, opts Options, test func(t *testing.T, e *env)) {
	t.Helper()
	for _, k := range []storeKind{postgresStore, memoryStore} {
		t.Run(k.name, func(t *testing.T) { test(t, newEnvWith(t, k, opts)) })
	}
}

// newEnv is an env over the PostgreSQL store, for tests of the server alone.
func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	return newEnvWith(t, postgresStore, opts)
}

func newEnvWith(t *testing.T, k storeKind, opts Options) *env {
	t.Helper()
	st, p := k.open(t)
	if opts.InFlightTakeover == 0 {
		opts.InFlightTakeover = 30 * time.Second
	}
	reg := prometheus.NewRegistry()
	srv, err := NewServerWithStore(st, reg, testLogger(t), Faults{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &env{srv: srv, url: hs.URL, probe: p, reg: reg, client: client}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewJSONHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// probe reads a store's charges for assertions, and ages them for takeover tests.
type probe interface {
	row(t *testing.T, key string) row
	count(t *testing.T) int
	// age makes the key's claim time d ago.
	age(t *testing.T, key string, d time.Duration)
	// ageCompleted makes the key's completion time d ago.
	ageCompleted(t *testing.T, key string, d time.Duration)
}

func openPostgres(t *testing.T) (Store, probe) {
	ctx := context.Background()
	db, err := database.Open(ctx, database.Options{
		URL: kittest.Postgres(t), MaxConns: 10, StatementTimeout: 5 * time.Second, AppName: "fakegateway-test",
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, sqlDB, Migrations); err != nil {
		t.Fatal(err)
	}
	return NewPostgresStore(db), postgresProbe{db}
}

func openMemory(*testing.T) (Store, probe) {
	st := NewMemoryStore()
	return st, memoryProbe{st}
}

func (e *env) setFaults(t *testing.T, f Faults) {
	t.Helper()
	if err := e.srv.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

// reply is a response read in full.
type reply struct {
	code     int
	body     []byte
	replayed string
}

// post sends a charge; an empty key sends no Idempotency-Key header.
func (e *env) post(t *testing.T, key, body string) reply {
	t.Helper()
	return e.do(t, http.MethodPost, "/v1/charges", key, body)
}

func (e *env) do(t *testing.T, method, path, key, body string) reply {
	t.Helper()
	r, err := e.send(method, path, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send is do for goroutines, which must not call t.Fatal.
func (e *env) send(method, path, key, body string) (reply, error) {
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return reply{code: resp.StatusCode, body: b, replayed: resp.Header.Get("Idempotent-Replayed")}, nil
}

// row is a charges row as the tests inspect it.
type row struct {
	ID            string
	State         string
	Status        *string
	DeclineReason *string
	ResponseCode  *int
	ResponseBody  []byte
	Replays       int
	CompletedAt   *time.Time
}

func (e *env) row(t *testing.T, key string) row {
	t.Helper()
	return e.probe.row(t, key)
}

func (e *env) count(t *testing.T) int {
	t.Helper()
	return e.probe.count(t)
}

type postgresProbe struct{ db *gorm.DB }

func (p postgresProbe) row(t *testing.T, key string) row {
	t.Helper()
	var r row
	err := p.db.Raw(`SELECT id, state, status, decline_reason, response_code, response_body, replays, completed_at
		FROM charges WHERE idempotency_key = ? AND forgotten_at IS NULL`, key).Row().
		Scan(&r.ID, &r.State, &r.Status, &r.DeclineReason, &r.ResponseCode, &r.ResponseBody, &r.Replays, &r.CompletedAt)
	if err != nil {
		t.Fatalf("row of key %s: %v", key, err)
	}
	return r
}

func (p postgresProbe) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := p.db.Raw(`SELECT count(*) FROM charges`).Row().Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (p postgresProbe) age(t *testing.T, key string, d time.Duration) {
	t.Helper()
	err := p.db.Exec(`UPDATE charges SET created_at = now() - make_interval(secs => ?) WHERE idempotency_key = ? AND forgotten_at IS NULL`,
		d.Seconds(), key).Error
	if err != nil {
		t.Fatal(err)
	}
}

func (p postgresProbe) ageCompleted(t *testing.T, key string, d time.Duration) {
	t.Helper()
	res := p.db.Exec(`UPDATE charges SET completed_at = now() - make_interval(secs => ?) WHERE idempotency_key = ? AND forgotten_at IS NULL AND completed_at IS NOT NULL`,
		d.Seconds(), key)
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("age the completion of key %s: %v (%d rows)", key, res.Error, res.RowsAffected)
	}
}

type memoryProbe struct{ s *MemoryStore }

func (p memoryProbe) row(t *testing.T, key string) row {
	t.Helper()
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	ch, ok := p.s.byKey[key]
	if !ok {
		t.Fatalf("row of key %s: none", key)
	}
	r := row{ID: ch.id, State: ch.state, ResponseBody: ch.body, Replays: ch.replays}
	if ch.state == stateCompleted {
		status, code, at, reason := ch.status, ch.code, ch.completedAt, ch.reason // copies: the store goes on
		r.Status, r.ResponseCode, r.CompletedAt = &status, &code, &at
		if reason != "" {
			r.DeclineReason = &reason
		}
	}
	return r
}

func (p memoryProbe) count(*testing.T) int {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return len(p.s.byID)
}

func (p memoryProbe) age(t *testing.T, key string, d time.Duration) {
	t.Helper()
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	ch, ok := p.s.byKey[key]
	if !ok {
		t.Fatalf("age key %s: none", key)
	}
	ch.createdAt = time.Now().Add(-d)
}

func (p memoryProbe) ageCompleted(t *testing.T, key string, d time.Duration) {
	t.Helper()
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	ch, ok := p.s.byKey[key]
	if !ok || ch.completedAt.IsZero() {
		t.Fatalf("age the completion of key %s: no completed charge", key)
	}
	ch.completedAt = time.Now().Add(-d)
}

// counter reads one series of the registry, 0 when absent.
func (e *env) counter(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func chargeJSON(order string, amount int64) string {
	return fmt.Sprintf(`{"order_id":%q,"customer_id":"cust-1","amount_cents":%d,"currency":"EUR"}`, order, amount)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
