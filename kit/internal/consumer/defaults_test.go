package consumer

import "testing"

// Zero fields take Defaults; of Prefetch and Workers, one set alone takes
// the other along (Workers at most Prefetch), so that a Config that was valid
// with one set stays valid.
func TestDefaultsFillZeroFields(t *testing.T) {
	d := Defaults()
	for _, c := range []struct {
		name                      string
		prefetch, workers         int
		wantPrefetch, wantWorkers int
	}{
		{"neither", 0, 0, d.Prefetch, d.Workers},
		{"prefetch below the default workers", 50, 0, 50, 50},
		{"prefetch above", 500, 0, 500, d.Workers},
		{"workers above the default prefetch", 0, 300, 300, 300},
		{"workers below", 0, 4, d.Prefetch, 4},
		{"both", 8, 4, 8, 4},
	} {
		cfg := Config{Name: "t", AMQPURL: "amqp://x", Prefetch: c.prefetch, Workers: c.workers}
		cfg.setDefaults()
		if cfg.Prefetch != c.wantPrefetch || cfg.Workers != c.wantWorkers {
			t.Errorf("%s: prefetch %d, workers %d; want %d, %d", c.name, cfg.Prefetch, cfg.Workers, c.wantPrefetch, c.wantWorkers)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	var zero Config
	zero.setDefaults()
	if zero.MaxAttempts != d.MaxAttempts || zero.GroupCommitMax != d.GroupCommitMax || zero.GroupCommitWait != d.GroupCommitWait ||
		zero.Heartbeat != d.Heartbeat || len(zero.Topology.RetryDelays) != len(d.Topology.RetryDelays) {
		t.Errorf("a zero Config took %+v", zero)
	}
}
