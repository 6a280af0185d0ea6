package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

// pgbenchScript is the service's unit of work for a new message, with distinct
// random ids: the inbox claim and the payment insert in one transaction.
const pgbenchScript = `\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO inbox (message_id, consumer, payload_sha256)
  VALUES ('pgbench-' || :id, 'pgbench', sha256(('pgbench-' || :id)::bytea)) ON CONFLICT DO NOTHING;
INSERT INTO payments (order_id, message_id, customer_id, amount_cents, currency, status, charge_id)
  VALUES ('order-' || :id, 'pgbench-' || :id, 'cus-1', 1000, 'EUR', 'succeeded', 'ch_' || :id)
  ON CONFLICT (order_id) DO NOTHING;
END;
`

const pgbenchMissing = "pgbench not found on PATH; on Debian it ships with the server package (apt-get install postgresql-15), elsewhere with postgresql-contrib or postgresql-client"

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// runPgbench runs the transaction at the peers' concurrency, as many times as
// there are orders: the database's ceiling for this unit of work.
func (b *bench) runPgbench(ctx context.Context) (r result) {
	clients := b.o.peerWorkers
	perClient := (b.o.messages + clients - 1) / clients
	r = result{
		name:     "pgbench",
		label:    "pgbench: inbox + payment transaction (the ceiling)",
		settings: fmt.Sprintf("%d clients, -M prepared, %d transactions", clients, perClient*clients),
	}
	path, err := exec.LookPath("pgbench")
	if err != nil {
		r.err = fmt.Errorf("%s", pgbenchMissing)
		return r
	}
	st, cleanup, err := b.newStage(ctx, "pgbench", nil)
	if err != nil {
		r.err = err
		return r
	}
	defer cleanup()
	script := filepath.Join(b.dir, "pgbench.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o644); err != nil {
		r.err = err
		return r
	}
	obs, err := scratchdb.Observe(ctx, st.dbURL)
	if err != nil {
		r.err = err
		return r
	}
	defer obs.Close(context.Background())
	peaks := obs.SampleConnections(ctx, b.pg, 100*time.Millisecond)
	cmd := exec.CommandContext(ctx, path, "-n", "-M", "prepared", "-c", strconv.Itoa(clients),
		"-j", strconv.Itoa(min(clients, runtime.NumCPU())), "-t", strconv.Itoa(perClient), "-f", script, st.dbURL)
	out, err := cmd.CombinedOutput()
	r.conns, _ = peaks()
	if err != nil {
		r.err = fmt.Errorf("pgbench: %w: %s", err, strings.TrimSpace(string(out)))
		return r
	}
	m := tpsLine.FindSubmatch(out)
	if m == nil {
		r.err = fmt.Errorf("pgbench printed no tps line:\n%s", out)
		return r
	}
	r.rate, _ = strconv.ParseFloat(string(m[1]), 64)
	r.drained = perClient * clients
	return r
}
