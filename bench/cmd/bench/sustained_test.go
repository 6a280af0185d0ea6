package main

import (
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

func TestSustainedSummary(t *testing.T) {
	millis := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	run := sustainedRun{elapsed: 10 * time.Second, payments: 20000, sent: 19900}
	for i := range 100 {
		run.ages = append(run.ages, scratchdb.OutboxSample{Oldest: millis(10 * (i + 1)), Pending: i})
	}
	tests := []struct {
		name string
		edit func(r *sustainedRun)
		want []string
	}{
		{"a peak of 1 s is not under 1 s", func(*sustainedRun) {}, []string{"2000 payments committed per second", "1990 events sent per second",
			"max 1000 ms", "p99 990 ms", "did not stay under 1 s", "pending rows at most 99", "the backlog lasted the whole run"}},
		{"a backlog that ran out", func(r *sustainedRun) { r.ages = r.ages[:50]; r.dryAfter = 8 * time.Second },
			[]string{"max 500 ms", "it stayed under 1 s", "THE BACKLOG RAN OUT after 8 s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run
			r.ages = append([]scratchdb.OutboxSample(nil), run.ages...)
			tt.edit(&r)
			got := r.summary(10*time.Second, 2100, 0, 31500)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
		})
	}
}
