package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inbox-template/payment-service/bench/internal/load"
	"github.com/inbox-template/payment-service/bench/internal/proc"
)

// pipeline is the payment service with group commit and the gateway at 0 ms,
// emitting OrderPaid through its outbox to the shipping service, which books
// a pickup with the fake carrier for each: the relay's rate, and the latency
// from a payment to its event's mark and to its shipment, exact per order
// from the databases, apart for the drain and the paced phase. The table's
// p50/p99 stay the payment's publish→commit.
type pipeline struct {
	*service
	shipDB, carrierDB   string // database names
	shipURL, carrierURL string // their URLs
	carrier, shipping   *proc.Process
	payments            string // the payments database's URL
	summary             string
	// publishedAt is each paced order's first publish (order id → time).
	publishedAt map[string]time.Time
}

// published records the paced orders' publish times.
func (p *pipeline) published(msgs []load.Message) {
	p.publishedAt = map[string]time.Time{}
	for _, m := range msgs {
		var o struct {
			OrderID string `json:"order_id"`
		}
		if json.Unmarshal(m.Body, &o) != nil || m.PublishedAt.IsZero() {
			continue
		}
		if t, ok := p.publishedAt[o.OrderID]; !ok || m.PublishedAt.Before(t) {
			p.publishedAt[o.OrderID] = m.PublishedAt
		}
	}
}

func (b *bench) newPipeline() *pipeline { return &pipeline{service: b.newService(true, false)} }

func (p *pipeline) label() string {
	return "pipeline: payment-service (group commit, gateway 0 ms) → outbox → shipping-service"
}

// prepare starts the gateway, then the fake carrier and the shipping service
// on databases of their own, so that the shipping queue is bound before the
// first event is published.
func (p *pipeline) prepare(ctx context.Context, st *stage) error {
	if err := p.service.prepare(ctx, st); err != nil {
		return err
	}
	p.payments = st.dbURL
	var err error
	p.shipDB, p.carrierDB = st.dbName+"_shipping", st.dbName+"_carrier"
	if p.shipURL, err = p.b.pg.Create(ctx, p.shipDB); err != nil {
		return err
	}
	if p.carrierURL, err = p.b.pg.Create(ctx, p.carrierDB); err != nil {
		return err
	}
	caddr, err := freeAddr()
	if err != nil {
		return err
	}
	p.carrier, err = proc.Start("fake-carrier", p.b.bin("fake-carrier"), nil, []string{
		"DATABASE_URL=" + p.carrierURL, "HTTP_ADDR=" + caddr, "LOG_LEVEL=warn",
	}, filepath.Join(p.b.dir, st.name+"-fake-carrier.log"))
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, p.carrier, "http://"+caddr+"/healthz"); err != nil {
		return err
	}
	saddr, err := freeAddr()
	if err != nil {
		return err
	}
	p.shipping, err = proc.Start("shipping-service", p.b.bin("shipping-service"), nil, []string{
		"AMQP_URL=" + st.amqpURL, "DATABASE_URL=" + p.shipURL, "CARRIER_URL=http://" + caddr, "HTTP_ADDR=" + saddr, "LOG_LEVEL=warn",
	}, filepath.Join(p.b.dir, st.name+"-shipping-service.log"))
	if err != nil {
		return err
	}
	return waitHTTP(ctx, p.shipping, "http://"+saddr+"/readyz")
}

// finish waits for every succeeded payment's shipment, measures the second
// hop, then stops the payment service as the other configurations do.
func (p *pipeline) finish(ctx context.Context, since time.Time) (quantiles, error) {
	var q quantiles
	paid, err := createdAt(ctx, p.payments, `SELECT order_id, created_at, NULL::timestamptz FROM payments WHERE status = 'succeeded'`)
	if err != nil {
		return q, err
	}
	var shipped map[string][2]time.Time
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if shipped, err = createdAt(ctx, p.shipURL, `SELECT order_id, created_at, NULL::timestamptz FROM shipments`); err != nil {
			return q, err
		}
		if len(shipped) >= len(paid) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(shipped) < len(paid) {
		return q, fmt.Errorf("%d shipments for %d succeeded payments two minutes after the drain", len(shipped), len(paid))
	}
	sent, err := createdAt(ctx, p.payments, `SELECT id::text, created_at, sent_at FROM outbox WHERE status = 'sent'`)
	if err != nil {
		return q, err
	}
	p.summary = summarize(paid, shipped, sent, since) + publishToShipment(p.publishedAt, shipped)
	return p.service.finish(ctx, since)
}

// summarize renders the relay's rate and the two hops' latencies, apart for
// the drain (a backlog: the pre-filled queue) and the paced phase (steady
// load, from since). Each time is a transaction's start (now() in a column
// default: PostgreSQL keeps no commit time unless track_commit_timestamp is
// on): a payment's group-commit transaction, the relay's mark, the shipment's
// transaction.
func summarize(paid, shipped, sent map[string][2]time.Time, since time.Time) string {
	type phase struct {
		name       string
		waits, hop []float64
		first      time.Time
		last       time.Time
	}
	phases := [2]*phase{{name: "drain"}, {name: "paced"}}
	of := func(t time.Time) *phase {
		if t.Before(since) {
			return phases[0]
		}
		return phases[1]
	}
	for _, t := range sent {
		ph := of(t[0])
		if ph.first.IsZero() || t[1].Before(ph.first) {
			ph.first = t[1]
		}
		if t[1].After(ph.last) {
			ph.last = t[1]
		}
		ph.waits = append(ph.waits, t[1].Sub(t[0]).Seconds()*1000)
	}
	for id, t := range paid {
		if s, ok := shipped[id]; ok {
			ph := of(t[0])
			ph.hop = append(ph.hop, s[0].Sub(t[0]).Seconds()*1000)
		}
	}
	out := ""
	for _, ph := range phases {
		if len(ph.waits) == 0 {
			continue
		}
		slices.Sort(ph.waits)
		slices.Sort(ph.hop)
		rate := float64(len(ph.waits)) / math.Max(ph.last.Sub(ph.first).Seconds(), 1e-3)
		if out != "" {
			out += "; "
		}
		out += fmt.Sprintf("%s: the relay marked %d events sent at %.0f events/s (first to last mark of the phase; "+
			"it publishes what the payments commit, so this is at most their rate), payment→sent p50 %.1f ms, p99 %.1f ms, "+
			"payment→shipment p50 %.1f ms, p99 %.1f ms over %d orders",
			ph.name, len(ph.waits), rate, quantile(ph.waits, 0.5), quantile(ph.waits, 0.99),
			quantile(ph.hop, 0.5), quantile(ph.hop, 0.99), len(ph.hop))
	}
	return out + " (exact per event and order, from the databases; each time is its transaction's start: the payment's " +
		"group-commit transaction, the relay's mark after the broker's confirm, the shipment's transaction)"
}

// publishToShipment renders each paced order's publish (by the bench) to its
// shipment's transaction: the whole pipeline, exact per order.
func publishToShipment(published map[string]time.Time, shipped map[string][2]time.Time) string {
	var ms []float64
	for id, at := range published {
		if s, ok := shipped[id]; ok {
			ms = append(ms, s[0].Sub(at).Seconds()*1000)
		}
	}
	if len(ms) == 0 {
		return ""
	}
	slices.Sort(ms)
	return fmt.Sprintf("; paced publish→shipment p50 %.1f ms, p99 %.1f ms over %d orders (from the publish of the order to its shipment's transaction)",
		quantile(ms, 0.5), quantile(ms, 0.99), len(ms))
}

// quantile is the nearest-rank q-quantile of sorted.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[max(0, min(len(sorted)-1, int(math.Ceil(q*float64(len(sorted))))-1))]
}

// createdAt reads key → (first time, second time) rows of a query.
func createdAt(ctx context.Context, url, query string) (map[string][2]time.Time, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][2]time.Time{}
	for rows.Next() {
		var k string
		var a time.Time
		var b *time.Time
		if err := rows.Scan(&k, &a, &b); err != nil {
			return nil, err
		}
		v := [2]time.Time{a}
		if b != nil {
			v[1] = *b
		}
		out[k] = v
	}
	return out, rows.Err()
}

func (p *pipeline) note() string { return p.summary }

// helpers are the gateway and the pipeline's second half.
func (p *pipeline) helpers() []*proc.Process {
	return []*proc.Process{p.service.gateway, p.shipping, p.carrier}
}

func (p *pipeline) stop() {
	p.service.stop()
	for _, pr := range []*proc.Process{p.shipping, p.carrier} {
		if pr != nil {
			_ = pr.Stop(context.Background(), 30*time.Second)
		}
	}
	for _, db := range []string{p.shipDB, p.carrierDB} {
		if db != "" && !p.b.o.keep {
			_ = p.b.pg.Drop(context.Background(), db)
		}
	}
}
