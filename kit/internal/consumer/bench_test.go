package consumer

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkDrain measures how fast the runtime drains a pre-filled queue with
// a handler that only writes (no outside call), per message and with group
// commit, against the real broker and database. b.N is ignored: each run
// drains -drain messages and reports msg/s.
//
//	go test -run '^$' -bench Drain -benchtime 1x ./consumer   (in kit/)
func BenchmarkDrain(b *testing.B) {
	const n = 4000
	configs := []struct {
		name            string
		workers, commit int
		max             int
		wait            time.Duration
	}{
		{"per-message/committers=8", 64, 8, 1, 0},
		{"group=32/committers=4", 64, 4, 32, 2 * time.Millisecond},
		{"group=32/committers=4/wait=0", 64, 4, 32, 0},
		{"group=64/committers=2", 128, 2, 64, 2 * time.Millisecond},
	}
	for _, c := range configs {
		b.Run(c.name, func(b *testing.B) {
			e := newEnv(b)
			e.publishMany(n, "m")
			start := time.Now()
			rt := e.start(recordHandler(nil), func(cfg *Config) {
				cfg.Workers, cfg.Prefetch = c.workers, 2*c.workers
				cfg.Committers, cfg.GroupCommitMax, cfg.GroupCommitWait = c.commit, c.max, c.wait
			})
			for rt.count(OutcomeProcessed) < n {
				time.Sleep(5 * time.Millisecond)
			}
			el := time.Since(start)
			b.ReportMetric(float64(n)/el.Seconds(), "msg/s")
			fmt.Printf("%-28s %6.0f msg/s\n", c.name, float64(n)/el.Seconds())
		})
	}
}
