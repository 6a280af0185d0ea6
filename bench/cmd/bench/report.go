package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"

	amqp "github.com/rabbitmq/amqp091-go"
)

// machine is what the numbers were measured on.
type machine struct {
	cpu      string
	cores    int
	kernel   string
	rabbitmq string
	postgres string
	goVer    string
}

func describeMachine(ctx context.Context, b *bench) machine {
	m := machine{cpu: "unknown CPU", cores: runtime.NumCPU(), goVer: runtime.Version(), rabbitmq: "?", postgres: "?"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if v, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(v))
	}
	if conn, err := amqp.Dial(b.o.amqpURL); err == nil {
		if v, ok := conn.Properties["version"].(string); ok {
			m.rabbitmq = v
		}
		conn.Close()
	}
	if v, err := b.pg.Version(ctx); err == nil {
		v, _, _ = strings.Cut(v, " on ")
		m.postgres = strings.TrimPrefix(v, "PostgreSQL ")
	}
	if d, err := b.pg.Durability(ctx); err == nil {
		m.postgres += " (" + d + ")"
	}
	return m
}

// table is the report of a run.
type table struct {
	head   []string
	rows   [][]string
	notes  []string
	header string
}

func newTable(o options, m machine, results []result, perf error) table {
	t := table{head: []string{"configuration", "CPU µs/msg", "machine µs/msg", "× amqp091 (machine)", "consumer / helpers / PostgreSQL / RabbitMQ µs/msg", "consumer instructions/msg", "msg/s", "× amqp091", "ingest msg/s", "paced msg/s (lag, machine busy)", "paced CPU µs/msg", "p50", "p99", "peak RSS", "DB conns open/busy", "settings"}}
	var plain float64
	var plainCPU cpuPerMessage
	for _, r := range results {
		if r.name == "amqp091" && r.err == nil {
			plain, plainCPU = r.rate, r.cpu
		}
	}
	messages := 0
	for _, r := range results {
		if r.name != "pgbench" && r.unit == "" && r.drained > 0 {
			messages = r.drained
		}
		t.rows = append(t.rows, t.row(r, plain, plainCPU))
		if r.note != "" {
			t.notes = append(t.notes, r.label+": "+r.note)
		}
	}
	if n := relayAgainstService(o, results); n != "" {
		t.notes = append(t.notes, n)
	}
	t.header = fmt.Sprintf("bench: %d orders per configuration", o.messages)
	if messages > 0 {
		t.header += fmt.Sprintf(" (%d messages with the duplicates, seed %d)", messages, o.seed)
	}
	if o.paced > 0 {
		t.header += fmt.Sprintf("; publish→commit over a %s paced phase at %.0f%% of each drain rate (at most %.0f msg/s)",
			o.paced, 100*o.pacedFraction, o.pacedMaxRate)
	}
	t.header += fmt.Sprintf("\nmachine: %s, %d cores, %s; RabbitMQ %s; PostgreSQL %s; %s",
		m.cpu, m.cores, m.kernel, m.rabbitmq, m.postgres, m.goVer)
	t.notes = append(t.notes,
		"CPU µs/msg, the headline: CPU time (user and system, from /proc) of the consumer's process over the drain, from its start until every order had its payment, per message drained; steadier than msg/s on a shared machine. machine µs/msg: every CPU's busy time over the same window (the bench's own watching included), per message, and its ratio to the plain consumer's. The split: the consumer; its helpers (the fake gateway; in the pipeline also shipping-service and the fake carrier); every PostgreSQL process; the broker's Erlang VM.",
		instructionsNote(perf),
		"msg/s: messages settled per second, from the consumer's start until the queue is empty and every order has its payment (pgbench: transactions per second; relay: events marked sent per second, and its CPU columns are per event, the relay's process in the consumer's place; sustained: payments committed per second, and its CPU columns are per payment).",
		"ingest msg/s: messages taken off the work queue per second, from the consumer's start until none was ready: about msg/s for a consumer that acks after applying a message; the buffered inbox acks once a message is stored and applies it afterwards, so there msg/s is its processing rate.",
		"paced msg/s (lag, machine busy): the paced phase's rate, the time from its last publish until every message was settled (a lag of more than a moment means that the consumer fell behind, with the bench's publisher on the same cores, and p50/p99 then include queueing), and the machine's busy share of its cores from the first publish until then (the bench's publisher included). paced CPU µs/msg: the consumer process's CPU per message over the same window: at a lower rate its batches are smaller, so it is above the drain's.",
		"p50/p99: publish→commit in the paced phase; exact for the peers, ≈ interpolated linearly within the buckets of payment-service's consumer_end_to_end_seconds histogram.",
		"peak RSS: VmHWM of the consumer process. DB conns: peak sessions of the configuration's database in pg_stat_activity, sampled every 100 ms (busy: not idle).")
	return t
}

// relayAgainstService relates the relay alone's rate to the payment
// service's commit rate of the same run (group commit, gateway at 0 ms):
// payments committed per second over its drain, the duplicates left out.
func relayAgainstService(o options, results []result) string {
	var relay, svc *result
	for i, r := range results {
		switch {
		case r.err != nil:
		case r.name == "relay":
			relay = &results[i]
		case r.name == "service-gc" && r.drained > 0:
			svc = &results[i]
		}
	}
	if relay == nil || svc == nil {
		return ""
	}
	payments := svc.rate * float64(o.messages) / float64(svc.drained)
	return fmt.Sprintf("relay alone against the payment service: %.0f events/s against %.0f payments committed per second "+
		"by payment-service with group commit in this run (its drain, the duplicates left out): %.2f×.", relay.rate, payments, relay.rate/payments)
}

func instructionsNote(perf error) string {
	if perf != nil {
		return "consumer instructions/msg: not counted on this machine: " + perf.Error() + "."
	}
	return "consumer instructions/msg: instructions retired by the consumer's process (perf stat -e instructions -p, every thread), from just after its start until every order had its payment, per message drained, in thousands."
}

func (t *table) row(r result, plain float64, plainCPU cpuPerMessage) []string {
	if r.err != nil {
		t.notes = append(t.notes, fmt.Sprintf("%s failed: %v", r.name, r.err))
		return []string{r.label, "failed", "–", "–", "–", "–", "–", "–", "–", "–", "–", "–", "–", "–", "–", "–", r.settings}
	}
	cpu, machine, machineRatio, split := "–", "–", "–", "–"
	if c := r.cpu; c.measured {
		cpu, machine = fmt.Sprintf("%.0f", c.consumer), fmt.Sprintf("%.0f", c.machine)
		split = fmt.Sprintf("%.0f / %.0f / %.0f / %.0f", c.consumer, c.helpers, c.postgres, c.rabbitmq)
		if plainCPU.measured && plainCPU.machine > 0 && r.unit == "" {
			machineRatio = fmt.Sprintf("%.2f×", c.machine/plainCPU.machine)
		}
	}
	instr := "–"
	if r.instr > 0 {
		instr = fmt.Sprintf("%.0f k", r.instr/1000)
	}
	ratio := "–"
	if plain > 0 && r.unit == "" {
		ratio = fmt.Sprintf("%.2f×", r.rate/plain)
	}
	rss := "–"
	if r.rss > 0 {
		rss = fmt.Sprintf("%.1f MiB", float64(r.rss)/(1<<20))
	}
	paced, pacedCPU := "–", "–"
	if r.paced.rate > 0 {
		paced = fmt.Sprintf("%.0f (%.1f s, %.0f%%)", r.paced.rate, r.paced.lag.Seconds(), 100*r.paced.busy)
		if r.paced.cpu > 0 {
			pacedCPU = fmt.Sprintf("%.0f", r.paced.cpu)
		}
	}
	ingest := "–"
	if r.ingest > 0 {
		ingest = fmt.Sprintf("%.0f", r.ingest)
	}
	return []string{
		r.label, cpu, machine, machineRatio, split, instr, fmt.Sprintf("%.0f", r.rate), ratio, ingest, paced, pacedCPU,
		fmtLatency(r.lat, r.lat.p50, r.lat.above50), fmtLatency(r.lat, r.lat.p99, r.lat.above99),
		rss, fmt.Sprintf("%d/%d", r.conns.Open, r.conns.Busy), r.settings,
	}
}

func fmtLatency(q quantiles, ms float64, above bool) string {
	if q.n == 0 || math.IsNaN(ms) {
		return "–"
	}
	prefix := ""
	switch {
	case above:
		prefix = "> "
	case q.method == "histogram":
		prefix = "≈ "
	}
	if ms < 10 {
		return fmt.Sprintf("%s%.1f ms", prefix, ms)
	}
	return fmt.Sprintf("%s%.0f ms", prefix, ms)
}

func (t table) text() string {
	var b strings.Builder
	b.WriteString("\n" + t.header + "\n\n")
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(t.head, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
	b.WriteString("\n")
	for _, n := range t.notes {
		b.WriteString(n + "\n")
	}
	return b.String()
}

func (t table) markdown() string {
	var b strings.Builder
	b.WriteString(strings.ReplaceAll(t.header, "\n", "  \n") + "\n\n")
	b.WriteString("| " + strings.Join(t.head, " | ") + " |\n")
	b.WriteString(strings.Repeat("|---", len(t.head)) + "|\n")
	for _, r := range t.rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	b.WriteString("\n")
	for _, n := range t.notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}
