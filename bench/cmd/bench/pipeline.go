package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inbox-template/payment-service/bench/internal/proc"
)

// pipeline is the payment service with group commit and the gateway at 0 ms,
// emitting OrderPaid through its outbox to the shipping service, which books
// a pickup with the fake carrier for each: the relay's rate, and the latency
// from a payment's commit to its shipment's, exact per order from the two
// databases. The table's p50/p99 stay the payment's publish→commit.
type pipeline struct {
	*service
	shipDB, carrierDB   string // database names
	shipURL, carrierURL string // their URLs
	carrier, shipping   *proc.Process
	payments            string // the payments database's URL
	summary             string
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
	p.summary = summarize(paid, shipped, sent)
	return p.service.finish(ctx, since)
}

// summarize renders the relay's rate over the run and commit→shipment.
func summarize(paid, shipped, sent map[string][2]time.Time) string {
	var first, last time.Time
	var waits []float64
	for _, t := range sent {
		if first.IsZero() || t[1].Before(first) {
			first = t[1]
		}
		if t[1].After(last) {
			last = t[1]
		}
		waits = append(waits, t[1].Sub(t[0]).Seconds()*1000)
	}
	var hop []float64
	for id, t := range paid {
		if s, ok := shipped[id]; ok {
			hop = append(hop, s[0].Sub(t[0]).Seconds()*1000)
		}
	}
	slices.Sort(waits)
	slices.Sort(hop)
	rate := float64(len(sent)) / math.Max(last.Sub(first).Seconds(), 1e-3)
	return fmt.Sprintf("the relay published %d events at %.0f events/s (first to last confirm, paced by the payments' commits); "+
		"commit→sent p50 %.1f ms, p99 %.1f ms; payment commit→shipment commit p50 %.1f ms, p99 %.1f ms over %d orders "+
		"(exact, from the two databases); publish→shipment is about the payment's p50/p99 plus these",
		len(sent), rate, quantile(waits, 0.5), quantile(waits, 0.99), quantile(hop, 0.5), quantile(hop, 0.99), len(hop))
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
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
