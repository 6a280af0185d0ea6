package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/latency"
	"github.com/inbox-template/payment-service/bench/internal/proc"
)

// peer is one of this module's consumers: it records an exact publish→commit
// sample per message and writes them out when it stops.
type peer struct {
	b       *bench
	program string
	name    string
	desc    string
	args    []string
	p       *proc.Process
	samples string
}

func (b *bench) newPlain() *peer {
	w, pf := strconv.Itoa(b.o.peerWorkers), strconv.Itoa(b.o.peerPrefetch)
	return &peer{
		b: b, program: "bench-amqp091",
		name: "plain amqp091-go consumer, pgx, no gateway",
		desc: fmt.Sprintf("%s workers, prefetch %s, pgx pool %s", w, pf, w),
		args: []string{"-workers", w, "-prefetch", pf},
	}
}

func (b *bench) newWatermill() *peer {
	h := strconv.Itoa(b.o.peerWorkers)
	return &peer{
		b: b, program: "bench-watermill",
		name: "Watermill AMQP subscriber (defaults), pgx, no gateway",
		desc: fmt.Sprintf("%s handlers, prefetch 1 each (default), pgx pool %s", h, h),
		args: []string{"-handlers", h},
	}
}

func (p *peer) label() string    { return p.name }
func (p *peer) settings() string { return p.desc }

func (p *peer) prepare(context.Context, *stage) error { return nil }

func (p *peer) start(_ context.Context, st *stage) (*proc.Process, error) {
	p.samples = filepath.Join(p.b.dir, st.name+"-samples.txt")
	args := append([]string{"-amqp-url", st.amqpURL, "-database-url", st.dbURL, "-samples", p.samples}, p.args...)
	var err error
	p.p, err = proc.Start(p.program, p.b.bin(p.program), args, nil, filepath.Join(p.b.dir, st.name+"-"+p.program+".log"))
	return p.p, err
}

func (p *peer) pacedStarts(context.Context) error { return nil }

// finish stops the consumer, which writes its samples, and keeps those of the
// messages published since the paced phase began.
func (p *peer) finish(ctx context.Context, since time.Time) (quantiles, error) {
	if err := p.p.Stop(ctx, 30*time.Second); err != nil {
		return quantiles{}, err
	}
	if p.b.o.paced == 0 {
		return quantiles{}, nil
	}
	ms, err := latency.ReadSamples(p.samples, since)
	if err != nil {
		return quantiles{}, err
	}
	return quantiles{n: len(ms), p50: latency.Quantile(ms, 0.5), p99: latency.Quantile(ms, 0.99), method: "exact"}, nil
}

func (p *peer) stop() {
	if p.p != nil {
		_ = p.p.Stop(context.Background(), 30*time.Second)
	}
}
