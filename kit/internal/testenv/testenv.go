// Package testenv gives integration tests their own piece of the real services:
// a fresh PostgreSQL database and a fresh RabbitMQ vhost per test, removed again
// by t.Cleanup (a vhost of the batches RunMain makes, with the next batch: see
// vhosts.go). Tests fail, never skip, when a service is missing.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables that point the tests at other servers.
const (
	PostgresEnv = "TEST_DATABASE_URL" // an admin URL; default postgres://postgres@127.0.0.1:5432/postgres
	AMQPEnv     = "TEST_AMQP_URL"     // default amqp://guest:guest@127.0.0.1:5672/
	CtlEnv      = "TEST_RABBITMQCTL"  // command used to add vhosts; default rabbitmqctl
	// RunEnv names one run of the suite (CI sets it): every database and vhost
	// the run creates starts with <prefix>_<run>_, so that a run cleans up its
	// own leftovers and never another's on a shared server.
	RunEnv = "TEST_RUN_ID"
	// PrefixEnv is the first part of the name of every database and vhost the
	// tests create: t unless set (a lowercase letter, then up to 11 lowercase
	// letters and digits). Teams whose suites share servers each choose one;
	// CI's cleanup (.ci/run) removes <prefix>_<run>_… only.
	PrefixEnv = "TEST_NAME_PREFIX"
)

var validPrefix = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

// namePrefix is TEST_NAME_PREFIX, or t; a test fails at once on a value that
// cannot begin a database name and a vhost name alike.
func namePrefix(t testing.TB) string {
	t.Helper()
	p := getenv(PrefixEnv, "t")
	if !validPrefix.MatchString(p) {
		t.Fatalf("%s=%q: want a lowercase letter, then up to 11 lowercase letters and digits (it begins the name of each test database and vhost)", PrefixEnv, p)
	}
	return p
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Name returns a short unique lowercase name with the given prefix and, when
// TEST_RUN_ID is set, the run's id: <prefix>_<run>_<random>.
func Name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	if run := os.Getenv(RunEnv); run != "" {
		prefix += "_" + run
	}
	return prefix + "_" + hex.EncodeToString(b)
}

// Postgres creates an empty database for this test and returns its URL.
func Postgres(t testing.TB) string {
	t.Helper()
	admin := getenv(PostgresEnv, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	name := Name(namePrefix(t))
	exec := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create test database (is PostgreSQL up at %s=%s?): %v", PostgresEnv, admin, err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	t.Cleanup(func() {
		closeSession(u.String()) // Count's
		if err := exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return u.String()
}

// VHost gives this test a RabbitMQ vhost of its own, on which the URL's
// user has all permissions, and returns an AMQP URL into it; the vhost is
// deleted after the test (in a binary run by RunMain, with the next batch:
// see vhosts.go).
func VHost(t testing.TB) string {
	t.Helper()
	base := getenv(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/")
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	vhost := pooledVHost(t, user)
	if vhost != "" {
		t.Cleanup(func() { releaseVHost(t, vhost) })
	} else {
		vhost = Name(namePrefix(t))
		Ctl(t, "add_vhost", vhost)
		t.Cleanup(func() { Ctl(t, "delete_vhost", vhost) })
		Ctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	}
	u.Path = "/" + vhost
	return u.String()
}

// Ctl runs a rabbitmqctl command and fails the test if it fails.
func Ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := ctl(time.Minute, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// ctl runs rabbitmqctl (TEST_RABBITMQCTL) with args for at most timeout.
func ctl(timeout time.Duration, args ...string) (string, error) {
	cmd := strings.Fields(getenv(CtlEnv, "rabbitmqctl"))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cmd[0], append(cmd[1:], args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", strings.Join(cmd, " "), strings.Join(args, " "), err)
	}
	return string(out), nil
}

// Eventually polls cond until it holds or the timeout passes. Use it to wait for
// asynchronous effects, never to assert on speed: the timeout is generous.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok && err == nil {
			return
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
}

// Reaches waits until count reaches want for as long as the count keeps
// rising: it fails when the count stood still for stall (or count failed
// that long), or a minute before go test's -timeout, with the count in
// the message rather than a panic's goroutine dump. A bulk of work on a
// loaded machine then takes what it takes, and a wedge still fails within
// stall. Use it where the wait is for many effects (a backlog applied),
// Eventually where it is for one.
func Reaches(t testing.TB, stall time.Duration, what string, want int, count func() (int, error)) {
	t.Helper()
	end, _ := TestDeadline(t)
	if err := reach(stall, end, want, count, time.Now, func() { time.Sleep(50 * time.Millisecond) }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestDeadline is a minute before go test's -timeout ends the test binary
// (a quarter of what is left, if that is less), if t knows it: a wait that
// gives up there fails the test with its own message, where the timeout
// would panic.
func TestDeadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := d.Deadline(); ok {
			return end.Add(-min(time.Minute, time.Until(end)/4)), true
		}
	}
	return time.Time{}, false
}

// Progress is the stall bookkeeping of a wait for a bulk of work, which
// Reaches and the fault kit's drain share: the wait goes on for as long as
// the work advances, and is over when it stood still for the stall window,
// or a minute before go test's -timeout.
type Progress struct {
	stall time.Duration
	end   time.Time // zero: no deadline
	since time.Time // the last advance
	now   func() time.Time
}

// NewProgress starts the stall window now; t gives the deadline, if it has
// one.
func NewProgress(t testing.TB, stall time.Duration) *Progress {
	end, _ := TestDeadline(t)
	return newProgress(stall, end, time.Now)
}

func newProgress(stall time.Duration, end time.Time, now func() time.Time) *Progress {
	return &Progress{stall: stall, end: end, since: now(), now: now}
}

// Advanced says the work moved: the stall window starts again.
func (p *Progress) Advanced() { p.since = p.now() }

// Still is how long the work has stood still.
func (p *Progress) Still() time.Duration { return p.now().Sub(p.since) }

// Over says why the wait must end (nil while it may go on): no advance for
// the stall window, or the deadline passed.
func (p *Progress) Over() error {
	switch {
	case p.Still() >= p.stall:
		return fmt.Errorf("no progress for %s", p.stall)
	case !p.end.IsZero() && p.now().After(p.end):
		return errors.New("still rising, when the test's -timeout was a minute away")
	}
	return nil
}

// reach is Reaches on the given clock; a zero end is no deadline.
func reach(stall time.Duration, end time.Time, want int, count func() (int, error), now func() time.Time, sleep func()) error {
	p := newProgress(stall, end, now)
	best := -1
	var lastErr error
	for {
		n, err := count()
		if err == nil && n >= want {
			return nil
		}
		switch {
		case err != nil:
			lastErr = err
		case n > best:
			best, lastErr = n, nil
			p.Advanced()
		}
		if err := p.Over(); err != nil {
			return fmt.Errorf("%d of %d, %w (last error: %v)", max(best, 0), want, err, lastErr)
		}
		sleep()
	}
}

// FreeAddr returns a loopback address whose port was free a moment ago,
// below the kernel's ephemeral range when it can: a port in that range may
// become the local end of an outgoing connection (to PostgreSQL, to
// RabbitMQ) at any moment, and a process started, or restarted by a test,
// on that port then fails to listen with "address already in use".
func FreeAddr(t testing.TB) string {
	t.Helper()
	lo := ephemeralLow()
	if span := lo - 20000; span >= 1000 {
		for range 100 {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+mrand.IntN(span)))
			if l, err := net.Listen("tcp", addr); err == nil {
				l.Close()
				return addr
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 where
// it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
