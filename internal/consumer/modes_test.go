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
	cases := []struct {
		mode string
		want int
	}{
		{"inline", committers + LookupReaders},
		{"buffered", committers},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			before := batchServers(t)
			var r *runtime
			if c.mode == "buffered" {
				e := newBufferedEnv(t, nil)
				mode := bufferedMode(e.db, e.dbURL, nil)
				r = e.start(recordHandler(nil), func(cfg *Config) { mode(cfg); cfg.Committers = committers })
			} else {
				e := newEnv(t)
				r = e.start(recordHandler(nil), func(cfg *Config) { cfg.Committers = committers })
			}
			if got := batchServers(t) - before; got != c.want {
				t.Errorf("%s mode runs %d batch servers, want %d", c.mode, got, c.want)
			}
			r.shutdown(t)
		})
	}
}
