package main

import (
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/scratchdb"
)

func TestOutboxAges(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ages := []scratchdb.OutboxSample{
		{At: at(0), Pending: 3, Oldest: 20 * time.Millisecond},
		{At: at(250), Pending: 40, Oldest: 300 * time.Millisecond},
		{At: at(500), Pending: 5, Oldest: 50 * time.Millisecond},
		{At: at(750), Pending: 0, Oldest: 0},
	}
	tests := []struct {
		name        string
		lastPublish time.Time
		want        []string
	}{
		{"the peak and the sample nearest the last publish", at(480), []string{"4 samples", "max 300 ms (40 rows pending then)", "at the last publish 50 ms (5 pending)"}},
		{"a last publish after every sample", at(2000), []string{"at the last publish 0 ms (0 pending)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := outboxAges(ages, tt.lastPublish)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
		})
	}
	if got := outboxAges(nil, t0); got != "" {
		t.Errorf("no samples: %q, want nothing", got)
	}
}
