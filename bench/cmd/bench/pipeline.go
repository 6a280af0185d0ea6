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
	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

// pipeline is the payment service with group commit and the gateway at 0 ms,
// emitting OrderPaid through its outbox to the shipping service, which books
// a pickup with the fake carrier for each: the relay's rate, and the latency
// from a payment to its event's mark and to its shipment, exact per order
// from the databases, apart for the drain and the paced phase. The paced
// phase starts once the drain has settled end to end, and samples the
// outbox's oldest pending age. The table's p50/p99 stay the payment's
// publish→commit.
type pipeline struct {
	*service
	shipDB, carrierDB   string // database names
	shipURL, carrierURL string // their URLs
	carrier, shipping   *proc.Process
	payments            string // the payments database's URL
	summary             string
	// publishedAt is each paced order's first publish (order id → time),
	// lastPublish the paced phase's last.
	publishedAt map[string]time.Time
	lastPublish time.Time
	// settled says how the drain ended end to end and which rate the paced
	// phase was paced at.
	settled string
	// stopAges ends the paced phase's samples of the outbox, ages.
	stopAges func() ([]scratchdb.OutboxSample, error)
	ages     []scratchdb.OutboxSample
}

// published records the paced orders' publish times.
func (p *pipeline) published(msgs []load.Message) {
	p.publishedAt = map[string]time.Time{}
	for _, m := range msgs {
		if m.PublishedAt.After(p.lastPublish) {
			p.lastPublish = m.PublishedAt
		}
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

// ageEvery is how often the paced phase samples the outbox's oldest pending age.
const ageEvery = 250 * time.Millisecond

// settle waits until every succeeded payment of the drain has its shipment
// and no outbox row is pending: the paced phase then starts on a pipeline
// with no backlog left anywhere. It measures the pipeline's end-to-end drain
// rate (from the payment service's start until the drain's last shipment)
// and returns the rate the paced phase is a fraction of (-pipeline-paced-base).
func (p *pipeline) settle(ctx context.Context, started time.Time, drained int, drainRate float64) (float64, error) {
	pay, err := scratchdb.Observe(ctx, p.payments)
	if err != nil {
		return 0, err
	}
	defer pay.Close(context.WithoutCancel(ctx))
	ship, err := pgx.Connect(ctx, p.shipURL)
	if err != nil {
		return 0, err
	}
	defer ship.Close(context.WithoutCancel(ctx))
	var paid, shipped int
	var last time.Time
	deadline := time.Now().Add(p.b.o.drainTimeout)
	for {
		idle, err := pay.OutboxDrained(ctx)
		if err != nil {
			return 0, err
		}
		if paid, err = pay.Succeeded(ctx); err != nil {
			return 0, err
		}
		var at *time.Time
		if err := ship.QueryRow(ctx, `SELECT count(*), max(created_at) FROM shipments`).Scan(&shipped, &at); err != nil {
			return 0, fmt.Errorf("count shipments: %w", err)
		}
		if idle && shipped >= paid && at != nil {
			last = *at
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d shipments for %d succeeded payments, outbox drained: %v, %s after the drain", shipped, paid, idle, p.b.o.drainTimeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	elapsed := last.Sub(started).Seconds()
	endToEnd := float64(drained) / elapsed
	p.b.logf("settled: %d orders shipped %.1fs after the consumer's start: %.0f orders/s end to end", shipped, elapsed, float64(shipped)/elapsed)
	p.settled = fmt.Sprintf("drain, end to end: %d orders shipped at %.0f orders/s (%.0f msg/s of the drain's messages), "+
		"from payment-service's start until the drain's last shipment; ", shipped, float64(shipped)/elapsed, endToEnd)
	p.settled += "the paced phase started once every succeeded payment had its shipment and no outbox row was pending, "
	base, rate := "the payment service's drain rate", drainRate
	if p.b.o.pipelineBase == basePipeline {
		base, rate = "the pipeline's end-to-end drain rate", endToEnd
	}
	p.settled += fmt.Sprintf("paced at %.0f%% of %s (%.0f msg/s; -pipeline-paced-base %s)", 100*p.b.o.pacedFraction, base, rate, p.b.o.pipelineBase)
	return rate, nil
}

// pacedStarts samples the outbox's oldest pending age until pacedEnds.
func (p *pipeline) pacedStarts(ctx context.Context) error {
	if err := p.service.pacedStarts(ctx); err != nil {
		return err
	}
	p.stopAges = scratchdb.SampleOutbox(ctx, p.payments, ageEvery)
	return nil
}

func (p *pipeline) pacedEnds() error {
	if p.stopAges == nil {
		return nil
	}
	var err error
	p.ages, err = p.stopAges()
	p.stopAges = nil
	return err
}

// outboxAges renders the paced phase's samples of the outbox: the oldest
// pending age's maximum, and its value at the last publish (the sample
// nearest to it).
func outboxAges(ages []scratchdb.OutboxSample, lastPublish time.Time) string {
	if len(ages) == 0 {
		return ""
	}
	var peak scratchdb.OutboxSample
	end := ages[0]
	for _, a := range ages {
		if a.Oldest > peak.Oldest {
			peak = a
		}
		if a.At.Sub(lastPublish).Abs() < end.At.Sub(lastPublish).Abs() {
			end = a
		}
	}
	return fmt.Sprintf("; paced: the outbox's oldest pending age (every %s, from the first publish until every paced payment was committed, %d samples): "+
		"max %.0f ms (%d rows pending then), at the last publish %.0f ms (%d pending)",
		ageEvery, len(ages), ms(peak.Oldest), peak.Pending, ms(end.Oldest), end.Pending)
}

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }

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
	p.summary = p.settled + "; " + summarize(paid, shipped, sent, since) + publishToShipment(p.publishedAt, shipped) + outboxAges(p.ages, p.lastPublish)
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
	_ = p.pacedEnds()
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
