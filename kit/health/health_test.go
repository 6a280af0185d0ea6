package health

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestReadinessExportsEachCheck: service_readiness is 1 for a passing
// check and 0 for a failing one, evaluated at each scrape.
func TestReadinessExportsEachCheck(t *testing.T) {
	failing := true
	reg := prometheus.NewRegistry()
	reg.MustRegister(Readiness(map[string]Check{
		"database": func(context.Context) error { return nil },
		"consumer": func(context.Context) error {
			if failing {
				return errors.New("stalled")
			}
			return nil
		},
	}))
	want := func(consumer string) string {
		return `# HELP service_readiness 1 while the readiness check passes, 0 while /readyz reports it failing.
# TYPE service_readiness gauge
service_readiness{check="consumer"} ` + consumer + `
service_readiness{check="database"} 1
`
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("0")), "service_readiness"); err != nil {
		t.Error(err)
	}
	failing = false
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("1")), "service_readiness"); err != nil {
		t.Error(err)
	}
}
