// Command bench measures the payment service side by side with its peers: for
// each configuration, on a fresh vhost and a fresh database, it pre-fills the
// work queue, starts the consumer, and measures how fast it drains the queue
// (messages settled per second, from the consumer's start until the queue is
// empty and every order has its payment); then it publishes at a steady rate
// for a while and measures publish→commit. It prints one table.
//
// It runs the template's built programs (bin/): inboxctl migrate applies the
// payments schema, payment-service and fake-gateway (STORE=memory,
// LOG_LEVEL=warn) are the system under test. The peers are bench-amqp091 and
// bench-watermill of this module, and pgbench. Each consumer is its own
// process, so that peak RSS compares. The relay configuration runs the
// outbox relay alone (bench-relay) on a full outbox; the sustained one runs
// payment-service at its full rate for minutes and watches its outbox.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/broker"
	"github.com/inbox-template/payment-service/bench/internal/proc"
	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := newBench(o, stderr)
	if err != nil {
		return err
	}
	m := describeMachine(ctx, b)
	b.logf("run %s: %d orders (+%.0f%% duplicates) per configuration; logs in %s", b.prefix, o.messages, 100*o.duplicateRate, b.dir)
	var results []result
	for _, name := range o.configs {
		b.logf("== %s", name)
		r := b.runConfig(ctx, name)
		if r.err != nil {
			b.logf("%s failed: %v", name, r.err)
		} else {
			unit := r.unit
			if unit == "" {
				unit = "msg"
			}
			b.logf("%s: %.0f %s/s", name, r.rate, unit)
		}
		results = append(results, r)
		if ctx.Err() != nil {
			break
		}
	}
	t := newTable(o, m, results, b.perf)
	fmt.Fprint(stdout, t.text())
	if o.markdownPath != "" {
		if err := os.WriteFile(o.markdownPath, []byte(t.markdown()), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", o.markdownPath, err)
		}
	}
	var failed []error
	for _, r := range results {
		if r.err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", r.name, r.err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d configurations failed (logs in %s): %w", len(failed), b.dir, errors.Join(failed...))
	}
	if o.workDir == "" {
		_ = os.RemoveAll(b.dir)
	}
	return ctx.Err()
}

// bench is one run: its options and what every configuration shares.
type bench struct {
	o      options
	prefix string // of every vhost and database this run creates
	dir    string // logs and samples
	ctl    broker.Ctl
	pg     scratchdb.Server
	stderr io.Writer
	start  time.Time
	perf   error // why instructions cannot be counted here, or nil
}

func newBench(o options, stderr io.Writer) (*bench, error) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	b := &bench{
		o:      o,
		prefix: "bench_" + hex.EncodeToString(suffix),
		ctl:    broker.NewCtl(o.rabbitmqctl, o.amqpURL),
		pg:     scratchdb.Server{AdminURL: o.adminURL},
		stderr: stderr,
		start:  time.Now(),
		perf:   proc.ProbeInstructions(),
	}
	b.dir = o.workDir
	if b.dir == "" {
		dir, err := os.MkdirTemp("", b.prefix+"-")
		if err != nil {
			return nil, fmt.Errorf("make a work directory: %w", err)
		}
		b.dir = dir
	} else if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return nil, fmt.Errorf("make the work directory: %w", err)
	}
	return b, nil
}

// logf prints a progress line to stderr, with the run's elapsed time.
func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.stderr, "[%4.0fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}
