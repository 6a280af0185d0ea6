package consumer

import (
	"testing"
	"time"
)

func TestRetryDelayGrowsThenRepeatsTheLast(t *testing.T) {
	t.Parallel()
	delays := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}
	tests := []struct {
		attempt int
		want    time.Duration
	}{
		{0, time.Second}, {1, time.Second}, {2, 5 * time.Second}, {3, 30 * time.Second}, {4, 30 * time.Second}, {99, 30 * time.Second},
	}
	for _, tt := range tests {
		if got := retryDelay(delays, tt.attempt); got != tt.want {
			t.Errorf("retryDelay(attempt %d) = %s, want %s", tt.attempt, got, tt.want)
		}
	}
}
