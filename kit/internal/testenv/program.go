package testenv

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Program is a main package of the module that end-to-end tests build once
// and run as processes, as it runs in production:
//
//	var refundService = testenv.NewProgram("../../cmd/refund-service")
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }
//
//	func TestRefunds(t *testing.T) {
//		p := refundService.Start(t, "AMQP_URL="+testenv.VHost(t), "DATABASE_URL="+testenv.Postgres(t))
//		testenv.Publish(t, …)
//	}
type Program struct {
	pkg  string // as go build takes it, relative to the test's package
	once sync.Once
	path string
	err  error
}

// NewProgram names the main package pkg; it is built at its first Start.
func NewProgram(pkg string) *Program { return &Program{pkg: pkg} }

// RunMain runs the tests, their vhosts made in batches (see vhosts.go),
// and then removes the vhosts and the programs they built (Build). Call it
// from TestMain: os.Exit(testenv.RunMain(m)).
func RunMain(m *testing.M) int {
	vhostPool.Lock()
	vhostPool.on = true
	vhostPool.Unlock()
	code := m.Run()
	if err := drainVHostPool(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: delete the tests' vhosts:", err)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	for _, d := range buildDirs {
		_ = os.RemoveAll(d)
	}
	return code
}

// Path builds the program, once per test binary (see Build), and returns
// the binary's path.
func (p *Program) Path(t testing.TB) string {
	t.Helper()
	p.once.Do(func() {
		var dir string
		if dir, p.err = Build(p.pkg); p.err == nil {
			p.path = filepath.Join(dir, filepath.Base(p.pkg))
		}
	})
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.path
}

// Process is a running program.
type Process struct {
	Addr string   // its HTTP_ADDR: health, readiness, metrics, fault endpoints
	Env  []string // the environment it runs with
	// FaultsToken is its FAULTS_TOKEN, which its fault endpoints require
	// (FaultsRequest sends it).
	FaultsToken string
	Out         *Buffer // what it wrote to stdout and stderr since its last start
	path        string
	cmd         *exec.Cmd
	done        chan struct{}
	// earlier is what the runs before the last one wrote (Restart, Revive).
	earlier strings.Builder
}

// Start runs the program with the environment plus env (NAME=value), a free
// HTTP_ADDR, FAULTS_ENABLED=true with a FAULTS_TOKEN of its own, and the
// suite's group commit setting, and
// waits until /readyz answers 200. The process is killed when the test ends;
// its output is logged if the test failed.
func (p *Program) Start(t testing.TB, env ...string) *Process {
	t.Helper()
	pr := &Process{Addr: FreeAddr(t), path: p.Path(t), FaultsToken: rand.Text()}
	pr.Env = append(os.Environ(), "HTTP_ADDR="+pr.Addr, "FAULTS_ENABLED=true", "FAULTS_TOKEN="+pr.FaultsToken)
	pr.Env = append(pr.Env, GroupCommitVars()...)
	pr.Env = append(pr.Env, env...)
	pr.start(t, "/readyz")
	return pr
}

// Restart starts the program again with the same environment and address,
// after the process has exited (a crash point, a signal), and waits until
// /readyz answers 200.
func (pr *Process) Restart(t testing.TB) {
	t.Helper()
	pr.restart(t, "/readyz")
}

// Revive is Restart as a supervisor does it (systemd, Kubernetes, Docker's
// restart policy): it waits for /healthz only, since a replica that is alive
// but not ready (its database away) must run all the same.
func (pr *Process) Revive(t testing.TB) {
	t.Helper()
	pr.restart(t, "/healthz")
}

func (pr *Process) restart(t testing.TB, probePath string) {
	t.Helper()
	select {
	case <-pr.done:
	default:
		t.Fatal("Restart: the process is still running")
	}
	pr.earlier.WriteString(pr.Out.String())
	pr.start(t, probePath)
}

// Logs is everything the process wrote, across its restarts.
func (pr *Process) Logs() string { return pr.earlier.String() + pr.Out.String() }

// Kill sends SIGKILL, as an OOM killer or a power cut would, and waits until
// the process is gone.
func (pr *Process) Kill(t testing.TB) {
	t.Helper()
	_ = pr.cmd.Process.Kill()
	select {
	case <-pr.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still running 10s after SIGKILL", filepath.Base(pr.path))
	}
}

func (pr *Process) start(t testing.TB, probePath string) {
	t.Helper()
	pr.Out, pr.done = &Buffer{}, make(chan struct{})
	pr.cmd = exec.Command(pr.path)
	pr.cmd.Env = pr.Env
	pr.cmd.Stdout, pr.cmd.Stderr = pr.Out, pr.Out
	if err := pr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd, done, out := pr.cmd, pr.done, pr.Out
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("--- %s output:\n%s", filepath.Base(pr.path), out)
		}
	})
	Eventually(t, time.Minute, filepath.Base(pr.path)+" "+probePath+" 200", func() (bool, error) {
		select {
		case <-done: // it will not answer: no point in waiting out the minute
			t.Fatalf("%s exited with status %d during its start:\n%s", filepath.Base(pr.path), cmd.ProcessState.ExitCode(), out)
		default:
		}
		resp, err := probe.Get("http://" + pr.Addr + probePath)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			// Which check failed, for the timeout's message.
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return false, fmt.Errorf("%s answered %d: %s", probePath, resp.StatusCode, strings.TrimSpace(string(body)))
		}
		return true, nil
	})
}

// probe asks for readiness; a server that hangs fails the ask, not the test.
var probe = &http.Client{Timeout: 5 * time.Second}

// Wait waits up to timeout for the process to exit and returns its status.
func (pr *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-pr.done:
		return pr.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", filepath.Base(pr.path), timeout)
		return 0
	}
}

// Exited reports whether the process has exited (a crash point fired, a
// signal), without waiting.
func (pr *Process) Exited() bool {
	select {
	case <-pr.done:
		return true
	default:
		return false
	}
}

// ExitsWithin reports whether the process has exited or exits within d.
func (pr *Process) ExitsWithin(d time.Duration) bool {
	select {
	case <-pr.done:
		return true
	case <-time.After(d):
		return false
	}
}

// ExitCode is the status the process exited with, -1 while it runs.
func (pr *Process) ExitCode() int {
	if !pr.Exited() {
		return -1
	}
	return pr.cmd.ProcessState.ExitCode()
}

// Metric reads one of the process's metrics (testenv.Metric on its address).
func (pr *Process) Metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return Metric(t, pr.Addr, name, labels...)
}

// Signal sends sig to the process.
func (pr *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := pr.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// ArmCrash arms a crash point (POST /faults/crash?at=point): the process
// dies there at its next message.
func (pr *Process) ArmCrash(t testing.TB, point string) {
	t.Helper()
	pr.ArmCrashWith(t, point, 0)
}

// ArmCrashWith arms a crash point to fire at each message with probability
// p (0 < p <= 1), or at the next one (p = 0), as the chaos run does.
func (pr *Process) ArmCrashWith(t testing.TB, point string, p float64) {
	t.Helper()
	u := "http://" + pr.Addr + "/faults/crash?at=" + point
	if p > 0 {
		u += "&probability=" + strconv.FormatFloat(p, 'f', -1, 64)
	}
	req, err := pr.FaultsRequest(http.MethodPost, u)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("arming %s answered %d", point, resp.StatusCode)
	}
}

// Command runs the program once more with a command (its operations
// commands: "dlq", "list") and the process's environment, and returns what
// it printed.
func (pr *Process) Command(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(pr.path, args...)
	cmd.Env = pr.Env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Publish sends msgs to exchange with key on a confirm channel and waits for
// each confirm. A message without a content type is sent as JSON, and every
// one as persistent.
func Publish(t testing.TB, amqpURL, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		for _, m := range msgs {
			if m.ContentType == "" {
				m.ContentType = "application/json"
			}
			m.DeliveryMode = amqp.Persistent
			if err := rabbit.PublishConfirmed(context.Background(), ch, exchange, key, m); err != nil {
				return err
			}
		}
		return nil
	})
}

// Count runs a query that returns one number (SELECT count(*) …) on dbURL,
// on a session kept for that URL: opening one costs about 30 ms of CPU on a
// 2-core machine (PostgreSQL forks a backend), and tests poll counts twenty
// times a second. A session that died under it (a test terminated the
// database's sessions) is opened again and the query run once more. The
// session closes when the test that opened it ends.
func Count(t testing.TB, dbURL, sql string, args ...any) int {
	t.Helper()
	n, err := sessionFor(t, dbURL).count(sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// sessions are Count's sessions, one per database URL; each closes at the
// end of the test that opened it (and testenv.Postgres closes its
// database's before it drops it).
var sessions = struct {
	sync.Mutex
	m map[string]*session
}{m: map[string]*session{}}

type session struct {
	url  string
	mu   sync.Mutex // one query at a time
	conn *pgx.Conn
}

func sessionFor(t testing.TB, url string) *session {
	sessions.Lock()
	defer sessions.Unlock()
	s := sessions.m[url]
	if s == nil {
		s = &session{url: url}
		sessions.m[url] = s
		t.Cleanup(func() { closeSession(url) })
	}
	return s
}

func (s *session) count(sql string, args ...any) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int
	for try := 0; ; try++ {
		if s.conn == nil {
			conn, err := pgx.Connect(ctx, s.url)
			if err != nil {
				return 0, err
			}
			s.conn = conn
		}
		err := s.conn.QueryRow(ctx, sql, args...).Scan(&n)
		if err == nil {
			return n, nil
		}
		if !s.conn.IsClosed() || try == 1 {
			return 0, err // the query's own failure, or a second dead session
		}
		s.conn = nil // terminated: its transaction, if any, rolled back
	}
}

// closeSession closes Count's session of url, if it has one.
func closeSession(url string) {
	sessions.Lock()
	s := sessions.m[url]
	delete(sessions.m, url)
	sessions.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.conn.Close(ctx)
		s.conn = nil
	}
}

// FaultsRequest is a request to the process's fault endpoints, with its token.
func (pr *Process) FaultsRequest(method, url string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return nil, err
	}
	if pr.FaultsToken != "" {
		req.Header.Set("Authorization", "Bearer "+pr.FaultsToken)
	}
	return req, nil
}
