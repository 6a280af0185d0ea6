package testenv

import (
	"net"
	"strconv"
	"testing"
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
