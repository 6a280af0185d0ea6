package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A port of the kernel's ephemeral range may be taken at any moment as the
// local end of an outgoing connection; a program a test starts, or restarts,
// on it would then fail to listen. FreeAddr stays below the range.
func TestFreeAddrIsBelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	if lo-20000 < 1000 {
		t.Fatalf("the ephemeral range starts at %d: no room below it for FreeAddr", lo)
	}
	seen := map[string]bool{}
	for range 50 {
		addr := FreeAddr(t)
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < 20000 || port >= lo {
			t.Fatalf("FreeAddr gave %s: want a port in [20000, %d)", addr, lo)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("FreeAddr gave %s, which cannot be listened on: %v", addr, err)
		}
		l.Close()
		seen[addr] = true
	}
	if len(seen) < 10 {
		t.Fatalf("FreeAddr gave only %d distinct addresses in 50 calls", len(seen))
	}
}

// fakeClock moves only when the code under test sleeps: a test of a wait
// then takes no time and does not depend on the machine's load.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }
func (c *fakeClock) sleep()         { c.t = c.t.Add(time.Second) }

func TestReachesWaitsAsLongAsTheCountRises(t *testing.T) {
	// One step every 3 s of the clock for 100 steps: 300 s in all, far past
	// the 10-s stall window, which no single step reaches.
	c, sleeps := &fakeClock{t: time.Unix(0, 0)}, 0
	err := reach(10*time.Second, time.Time{}, 100, func() (int, error) { return sleeps / 3, nil }, c.now, func() { c.sleep(); sleeps++ })
	if err != nil {
		t.Fatalf("reach failed on a count that kept rising: %v", err)
	}
	if waited := c.t.Sub(time.Unix(0, 0)); waited < 290*time.Second {
		t.Fatalf("reach returned after %s of the clock, before the count could reach 100", waited)
	}
}

func TestReachesFailsWhenTheCountStandsStill(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	err := reach(10*time.Second, time.Time{}, 10, func() (int, error) { return 3, nil }, c.now, c.sleep)
	if err == nil || !strings.Contains(err.Error(), "3 of 10, no progress for 10s") {
		t.Fatalf("reach = %v, want it to fail at 3 of 10", err)
	}
	if waited := c.t.Sub(time.Unix(0, 0)); waited != 10*time.Second {
		t.Fatalf("reach failed after %s of the clock, want the 10-s stall window", waited)
	}
	err = reach(10*time.Second, time.Time{}, 10, func() (int, error) { return 0, errors.New("db down") }, c.now, c.sleep)
	if err == nil || !strings.Contains(err.Error(), "db down") {
		t.Fatalf("reach = %v, want the count's last error", err)
	}
}

func TestReachesGivesUpBeforeTheTestsDeadline(t *testing.T) {
	// Rising forever, one step a second: the 10-s stall never ends it, the
	// deadline 100 s on does, with the count.
	c := &fakeClock{t: time.Unix(0, 0)}
	n := 0
	err := reach(10*time.Second, c.t.Add(100*time.Second), 1_000_000, func() (int, error) { n++; return n, nil }, c.now, c.sleep)
	if err == nil || !strings.Contains(err.Error(), "still rising, when the test's -timeout was a minute away") {
		t.Fatalf("reach = %v, want it to give up at the deadline", err)
	}
	if waited := c.t.Sub(time.Unix(0, 0)); waited < 100*time.Second || waited > 102*time.Second {
		t.Fatalf("reach gave up after %s of the clock, want about 100 s", waited)
	}
}

// fatalTB records a Fatalf and stops there (by panicking, recovered by the
// caller) instead of failing the test that uses it.
type fatalTB struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func TestNamesTakeTheChosenPrefix(t *testing.T) {
	t.Setenv(RunEnv, "run1")
	t.Setenv(PrefixEnv, "acme2")
	if n := Name(namePrefix(t)); !strings.HasPrefix(n, "acme2_run1_") {
		t.Errorf("a name under %s=acme2 is %q, want acme2_run1_…", PrefixEnv, n)
	}
	t.Setenv(PrefixEnv, "")
	if p := namePrefix(t); p != "t" {
		t.Errorf("the prefix unset is %q, want t", p)
	}
	for _, bad := range []string{"Acme", "1acme", "ac-me", "ac_me", "abcdefghijklm"} {
		t.Setenv(PrefixEnv, bad)
		f := &fatalTB{TB: t}
		func() {
			defer func() {
				if r := recover(); r != nil {
					if _, ok := r.(stopped); !ok {
						panic(r)
					}
				}
			}()
			namePrefix(f)
		}()
		if !strings.Contains(f.msg, PrefixEnv+`="`+bad+`"`) {
			t.Errorf("%s=%q: the test was told %q, want it refused naming the variable and the value", PrefixEnv, bad, f.msg)
		}
	}
}

// Count keeps one session per database: the same backend answers twice;
// once a test terminated it, Count opens a new one and answers; and the
// session closes when the test that opened it ends.
func TestCountKeepsASessionOpensItAgainAndClosesIt(t *testing.T) {
	db := Postgres(t)
	other := func(sql string, args ...any) int { // on a session of its own
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var first int
	t.Run("kept", func(t *testing.T) {
		first = Count(t, db, "SELECT pg_backend_pid()")
		if again := Count(t, db, "SELECT pg_backend_pid()"); again != first {
			t.Fatalf("backend %d, then %d: the session was not kept", first, again)
		}
		// Terminated, and gone (the call waits for the backend's exit).
		if other("SELECT pg_terminate_backend($1, 30000)::int", first) != 1 {
			t.Fatal("terminate")
		}
		next := Count(t, db, "SELECT pg_backend_pid()")
		if next == first {
			t.Fatalf("backend %d answered after its termination", first)
		}
		first = next
	})
	// The subtest opened it: it closed at the subtest's end (the backend
	// ends once it reads the close).
	Eventually(t, 30*time.Second, "the session of the test that ended closed", func() (bool, error) {
		return other("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", first) == 0, nil
	})
}
