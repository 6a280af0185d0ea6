package testenv

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
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
