package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/latency"
	"github.com/inbox-template/payment-service/bench/internal/proc"
)

// The payment service's end-to-end histogram: publish time (the header
// timestamp_in_ms when present) to the commit of the message's effects.
const (
	endToEndMetric = "consumer_end_to_end_seconds"
	endToEndSeries = `consumer="payment-service"`
)

// service is the template's payment-service with the fake gateway.
type service struct {
	b           *bench
	groupCommit bool
	inboxMode   string // "" (the default, inline) or buffered
	latency     time.Duration
	env         []string // the configuration's knobs, NAME=value
	// kitOnly runs bench-kit instead: the kit with the peers' unit of work,
	// no gateway, no outbox.
	kitOnly bool

	gateway, svc *proc.Process
	gatewayURL   string
	metricsURL   string
	before       []latency.Bucket
}

// newService builds the configuration: per message or with group commit, the
// gateway at 0 ms or at -latency.
func (b *bench) newService(groupCommit, slowGateway bool) *service {
	s := &service{b: b, groupCommit: groupCommit}
	set := func(name string, v int) {
		if v > 0 {
			s.env = append(s.env, fmt.Sprintf("%s=%d", name, v))
		}
	}
	if slowGateway {
		s.latency = b.o.latency
		set("WORKERS", b.o.latencyWorkers)
		set("PREFETCH", b.o.latencyPrefetch)
		set("DB_MAX_CONNS", b.o.latencyDBs)
	} else {
		set("WORKERS", b.o.workers)
		set("PREFETCH", b.o.prefetch)
		set("DB_MAX_CONNS", b.o.dbConns)
	}
	switch {
	case !groupCommit:
		s.env = append(s.env, "GROUP_COMMIT_MAX=1")
	default:
		if b.o.groupCommitMax != "" {
			s.env = append(s.env, "GROUP_COMMIT_MAX="+b.o.groupCommitMax)
		}
		if b.o.groupCommitWait != "" {
			s.env = append(s.env, "GROUP_COMMIT_WAIT="+b.o.groupCommitWait)
		}
	}
	s.env = append(s.env, b.o.serviceEnv...)
	return s
}

// buffered switches the configuration to the buffered inbox (with its group
// commit settings: the ingest's batches and the processing's commits).
func (s *service) buffered() *service {
	s.inboxMode = "buffered"
	s.env = append([]string{"INBOX_MODE=buffered"}, s.env...)
	return s
}

// kit is the kit alone: bench-kit, group commit at the service's defaults,
// the peers' payment insert, no outside call.
func (s *service) kit() *service {
	s.kitOnly = true
	return s
}

func (s *service) label() string {
	if s.kitOnly {
		return "the kit alone (bench-kit), group commit, no gateway, no outbox"
	}
	mode := "per message"
	switch {
	case s.inboxMode == "buffered":
		mode = "buffered inbox"
	case s.groupCommit:
		mode = "group commit"
	}
	return fmt.Sprintf("payment-service, %s, gateway %s", mode, fmtDuration(s.latency))
}

func (s *service) settings() string {
	if len(s.env) == 0 {
		return "service defaults"
	}
	return strings.Join(s.env, " ")
}

// prepare starts the fake gateway: in-memory store, so that its commits are
// not measured, and LOG_LEVEL=warn, so that its log lines are not either.
func (s *service) prepare(ctx context.Context, st *stage) error {
	if s.kitOnly {
		return nil
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	s.gatewayURL = "http://" + addr
	s.gateway, err = proc.Start("fake-gateway", s.b.bin("fake-gateway"), nil, []string{
		"STORE=memory", "LOG_LEVEL=warn", "HTTP_ADDR=" + addr, "FAULT_LATENCY=" + s.latency.String(),
	}, filepath.Join(s.b.dir, st.name+"-fake-gateway.log"))
	if err != nil {
		return err
	}
	return waitHTTP(ctx, s.gateway, s.gatewayURL+"/healthz")
}

func (s *service) start(_ context.Context, st *stage) (*proc.Process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s.metricsURL = "http://" + addr + "/metrics"
	env := append([]string{
		"AMQP_URL=" + st.amqpURL, "DATABASE_URL=" + st.dbURL, "HTTP_ADDR=" + addr,
	}, s.env...)
	program := "payment-service"
	if s.kitOnly {
		program = "bench-kit"
	} else {
		env = append(env, "GATEWAY_URL="+s.gatewayURL)
	}
	s.svc, err = proc.Start(program, s.b.bin(program), nil, env,
		filepath.Join(s.b.dir, st.name+"-"+program+".log"))
	return s.svc, err
}

func (s *service) helpers() []*proc.Process { return []*proc.Process{s.gateway} }

func (s *service) pacedStarts(ctx context.Context) (err error) {
	s.before, err = s.scrape(ctx)
	return err
}

// finish reads the histogram's growth over the paced phase, then stops the
// service. since is implied: the phase began with the first scrape.
func (s *service) finish(ctx context.Context, _ time.Time) (quantiles, error) {
	var q quantiles
	if s.before != nil {
		after, err := s.scrape(ctx)
		if err != nil {
			return q, err
		}
		delta, err := latency.Delta(after, s.before)
		if err != nil {
			return q, err
		}
		q = quantiles{n: int(delta[len(delta)-1].Count), method: "histogram"}
		q.p50, q.above50 = latency.HistogramQuantile(delta, 0.5)
		q.p99, q.above99 = latency.HistogramQuantile(delta, 0.99)
	}
	return q, s.svc.Stop(ctx, 30*time.Second)
}

func (s *service) stop() {
	for _, p := range []*proc.Process{s.svc, s.gateway} {
		if p != nil {
			_ = p.Stop(context.Background(), 30*time.Second)
		}
	}
}

func (s *service) scrape(ctx context.Context) ([]latency.Bucket, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.metricsURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.metricsURL, err)
	}
	return latency.ParseHistogram(string(body), endToEndMetric, endToEndSeries)
}

// waitHTTP polls url until it answers 200, the process exits, or 30 s pass.
func waitHTTP(ctx context.Context, p *proc.Process, url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.Exited():
			return fmt.Errorf("%w; last lines:\n%s", p.ExitError(), p.Tail(5))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer %s within 30s", p.Name, url)
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func fmtDuration(d time.Duration) string {
	if d == 0 {
		return "0 ms"
	}
	if d%time.Millisecond == 0 {
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	}
	return d.String()
}
