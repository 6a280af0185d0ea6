package latency

import (
	"math"
	"path/filepath"
	"testing"
	"time"
)

const metrics = `# HELP consumer_end_to_end_seconds From the message's publish timestamp to the commit of its effects.
# TYPE consumer_end_to_end_seconds histogram
consumer_end_to_end_seconds_bucket{consumer="payment-service",le="0.01"} 10
consumer_end_to_end_seconds_bucket{consumer="payment-service",le="0.1"} 90
consumer_end_to_end_seconds_bucket{consumer="payment-service",le="1"} 100
consumer_end_to_end_seconds_bucket{consumer="payment-service",le="+Inf"} 100
consumer_end_to_end_seconds_sum{consumer="payment-service"} 4.2
consumer_end_to_end_seconds_count{consumer="payment-service"} 100
consumer_end_to_end_seconds_bucket{consumer="other",le="0.01"} 7
`

func TestParseHistogramAndQuantiles(t *testing.T) {
	after, err := ParseHistogram(metrics, "consumer_end_to_end_seconds", `consumer="payment-service"`)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 4 || !math.IsInf(after[3].UpperBound, 1) || after[1].Count != 90 {
		t.Fatalf("buckets = %+v", after)
	}
	before := []Bucket{{0.01, 10}, {0.1, 10}, {1, 10}, {math.Inf(1), 10}}
	delta, err := Delta(after, before)
	if err != nil {
		t.Fatal(err)
	}
	// 90 observations: 80 in (10 ms, 100 ms], 10 in (100 ms, 1 s].
	tests := []struct {
		q         float64
		wantMs    float64
		wantAbove bool
	}{
		{0.5, 10 + 90*(45.0/80), false}, // rank 45 of the 80 in the second bucket
		{0.99, 100 + 900*(9.1/10), false},
		{1, 1000, false},
	}
	for _, tt := range tests {
		got, above := HistogramQuantile(delta, tt.q)
		if math.Abs(got-tt.wantMs) > 1e-6 || above != tt.wantAbove {
			t.Errorf("q%.2f = %v ms (above %v), want %v ms", tt.q, got, above, tt.wantMs)
		}
	}
	over := []Bucket{{0.01, 0}, {math.Inf(1), 5}}
	if got, above := HistogramQuantile(over, 0.5); got != 10 || !above {
		t.Errorf("a rank in +Inf = %v ms above %v, want 10 ms above", got, above)
	}
	if got, _ := HistogramQuantile([]Bucket{{1, 0}, {math.Inf(1), 0}}, 0.5); !math.IsNaN(got) {
		t.Errorf("empty histogram = %v, want NaN", got)
	}
	if _, err := ParseHistogram(metrics, "consumer_end_to_end_seconds", `consumer="nobody"`); err == nil {
		t.Error("a missing series parsed")
	}
}

func TestSamplesRoundTrip(t *testing.T) {
	var r Recorder
	start := time.UnixMilli(1_700_000_000_000)
	for i := range 100 {
		published := start.Add(time.Duration(i) * time.Second)
		r.Record(published.UnixMilli(), published.Add(time.Duration(i+1)*time.Millisecond))
	}
	path := filepath.Join(t.TempDir(), "samples.txt")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSamples(path, start.Add(50*time.Second)) // the last 50: 51 … 100 ms
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 50 || Quantile(got, 0.5) != 75 || Quantile(got, 0.99) != 100 || Quantile(got, 0.01) != 51 {
		t.Fatalf("%d samples, p1 %v p50 %v p99 %v; want 50, 51, 75, 100", len(got), Quantile(got, 0.01), Quantile(got, 0.5), Quantile(got, 0.99))
	}
}
