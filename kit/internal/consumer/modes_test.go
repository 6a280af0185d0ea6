package consumer

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"testing"
)

// batchServers counts the goroutines that serve a batcher (committers,
// inbox look-ups, the buffered mode's finishers) in this test process.
func batchServers(t *testing.T) int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "(*batcher[") && strings.Contains(g, "]).run.func") {
			n++
		}
	}
	return n
}

// Only the mode that runs starts its goroutines: the inline mode its
// committers and look-up readers, the buffered mode its finishers alone
// (before, it started the inline ones too, idle).
func TestOnlyTheRunningModeStartsItsServers(t *testing.T) {
	const committers = 3
	eachMode(t, func(t *testing.T, m modeCase) {
		want := committers + LookupReaders
		if m.buffered() {
			want = committers
		}
		before := batchServers(t)
		e := m.newEnv(t)
		mode := m.config(e.db, e.dbURL, nil)
		r := e.start(recordHandler(nil), func(cfg *Config) { mode(cfg); cfg.Committers = committers })
		if got := batchServers(t) - before; got != want {
			t.Errorf("%s mode runs %d batch servers, want %d", m.name, got, want)
		}
		r.shutdown(t)
	})
}
