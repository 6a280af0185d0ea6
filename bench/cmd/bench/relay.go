package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/bench/internal/broker"
	"github.com/inbox-template/payment-service/bench/internal/proc"
	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

const relayLabel = "relay alone (bench-relay): a full outbox drained with confirms"

// runRelay measures the outbox relay alone: bench-relay fills the outbox with
// -relay-rows OrderPaid rows through the kit's Enqueue before the clock
// starts, then the relay, with the service's defaults and nothing else
// running, publishes them into a quorum queue with confirms. The clock runs
// from the relay's start until no row is pending.
func (b *bench) runRelay(ctx context.Context) (r result) {
	r = result{name: "relay", label: relayLabel, settings: "service defaults (OUTBOX_BATCH=100), a key per row", unit: "events"}
	st, cleanup, err := b.newStage(ctx, "relay", func(url string) error { return broker.DeclareEvents(url, 0) })
	if err != nil {
		r.err = err
		return r
	}
	defer cleanup()
	r.err = b.measureRelay(ctx, st, &r)
	return r
}

func (b *bench) measureRelay(ctx context.Context, st *stage, r *result) error {
	n := b.o.relayRows
	b.logf("filling the outbox with %d rows", n)
	if err := b.fillOutbox(ctx, st, n); err != nil {
		return err
	}
	obs, err := scratchdb.Observe(ctx, st.dbURL)
	if err != nil {
		return err
	}
	defer obs.Close(context.Background())
	if c, err := obs.OutboxCounts(ctx); err != nil || c.Pending != n {
		return fmt.Errorf("fill: %d rows pending, want %d (%v)", c.Pending, n, err)
	}
	peaks := obs.SampleConnections(ctx, b.pg, 100*time.Millisecond)
	defer func() { r.conns, _ = peaks() }()

	before, err := sampleCPU(nil, nil)
	if err != nil {
		return err
	}
	started := time.Now()
	p, err := proc.Start("bench-relay", b.bin("bench-relay"),
		[]string{"relay", "-database-url", st.dbURL, "-amqp-url", st.amqpURL}, nil,
		filepath.Join(b.dir, st.name+"-bench-relay.log"))
	if err != nil {
		return err
	}
	defer func() { _ = p.Stop(context.Background(), 30*time.Second) }()
	done, err := waitOutboxDrained(ctx, obs, p, b.o.drainTimeout)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	after, err := sampleCPU(p, nil)
	if err != nil {
		return err
	}
	if r.rss, err = p.PeakRSS(); err != nil {
		return err
	}
	if err := p.Stop(ctx, 30*time.Second); err != nil {
		return err
	}
	r.cpu = perMessage(before, after, n)
	r.drained = n
	r.rate = float64(n) / done.Sub(started).Seconds()
	b.logf("the relay sent %d events in %.1fs: %.0f events/s", n, done.Sub(started).Seconds(), r.rate)
	if err := checkRelayed(ctx, obs, st, n); err != nil {
		return err
	}
	r.note = fmt.Sprintf("from a full outbox of %d rows (OrderPaid, an ordering key each, committed by outbox.Enqueue before the clock starts), "+
		"the relay alone marked every row sent at %.0f events/s (from its start until none was pending; the rate column), publishing into a quorum queue "+
		"with confirms; CPU per event: the relay's process %.0f µs, PostgreSQL %.0f µs, RabbitMQ %.0f µs, the machine %.0f µs",
		n, r.rate, r.cpu.consumer, r.cpu.postgres, r.cpu.rabbitmq, r.cpu.machine)
	return nil
}

// fillOutbox runs bench-relay fill and waits for it.
func (b *bench) fillOutbox(ctx context.Context, st *stage, rows int) error {
	log, err := os.OpenFile(filepath.Join(b.dir, st.name+"-fill.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, b.bin("bench-relay"), "fill", "-database-url", st.dbURL, "-rows", strconv.Itoa(rows), "-run", st.run)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("bench-relay fill: %w (log: %s)", err, log.Name())
	}
	return nil
}

// waitOutboxDrained polls until no outbox row is pending and returns when it
// first saw none.
func waitOutboxDrained(ctx context.Context, obs *scratchdb.Observer, p *proc.Process, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		drained, err := obs.OutboxDrained(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if drained {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("rows still pending after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-p.Exited():
			return time.Time{}, fmt.Errorf("%w; last lines:\n%s", p.ExitError(), p.Tail(5))
		case <-tick.C:
		}
	}
}

// checkRelayed checks that every row was sent, none parked, and that the
// queue holds one message per row.
func checkRelayed(ctx context.Context, obs *scratchdb.Observer, st *stage, rows int) error {
	c, err := obs.OutboxCounts(ctx)
	if err != nil {
		return err
	}
	if c.Sent != rows || c.Parked != 0 {
		return fmt.Errorf("%d rows sent and %d parked, want %d sent", c.Sent, c.Parked, rows)
	}
	conn, err := amqp.Dial(st.amqpURL)
	if err != nil {
		return fmt.Errorf("connect to count the events: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	n, err := broker.Ready(ch, broker.EventsQueue)
	if err != nil {
		return err
	}
	if n != rows {
		return fmt.Errorf("%s holds %d events, want %d", broker.EventsQueue, n, rows)
	}
	return nil
}
