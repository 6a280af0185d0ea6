// Package latency measures publish→commit: the peers record one exact sample
// per message, the payment service a Prometheus histogram, and both end up as
// p50 and p99 of the paced phase.
package latency

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Recorder keeps the samples of a peer consumer; safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	publishedMs int64
	latencyMs   float64
}

// Record notes a message published at publishedMs (Unix milliseconds) whose
// effects were committed at committed.
func (r *Recorder) Record(publishedMs int64, committed time.Time) {
	ms := float64(committed.UnixMicro())/1000 - float64(publishedMs)
	r.mu.Lock()
	r.samples = append(r.samples, sample{publishedMs, ms})
	r.mu.Unlock()
}

// WriteFile writes the samples as lines "published_ms latency_ms".
func (r *Recorder) WriteFile(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, s := range r.samples {
		fmt.Fprintf(&b, "%d %.3f\n", s.publishedMs, s.latencyMs)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// ReadSamples returns the latencies (ms) of the messages published at or after
// since, from a file written by WriteFile.
func ReadSamples(path string, since time.Time) ([]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pub, lat, ok := strings.Cut(sc.Text(), " ")
		p, err1 := strconv.ParseInt(pub, 10, 64)
		l, err2 := strconv.ParseFloat(lat, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: bad sample line %q", path, sc.Text())
		}
		if p >= since.UnixMilli() {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// Quantile is the q-quantile (0 < q ≤ 1) of samples by nearest rank; NaN if none.
func Quantile(samples []float64, q float64) float64 {
	if len(samples) == 0 {
		return math.NaN()
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

// Bucket is one cumulative bucket of a Prometheus histogram.
type Bucket struct {
	UpperBound float64 // seconds; +Inf for the last
	Count      float64 // observations ≤ UpperBound
}

// ParseHistogram reads the cumulative buckets of one series of the histogram
// metric from the Prometheus text format; labels are those of the series, such
// as `consumer="payment-service"`, besides le.
func ParseHistogram(text, metric, labels string) ([]Bucket, error) {
	var out []Bucket
	prefix := metric + "_bucket{"
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, prefix) || !strings.Contains(line, labels) {
			continue
		}
		le, ok := labelValue(line, "le")
		val := line[strings.LastIndexByte(line, ' ')+1:]
		bound, err1 := strconv.ParseFloat(le, 64) // accepts "+Inf"
		count, err2 := strconv.ParseFloat(val, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad histogram line %q", line)
		}
		out = append(out, Bucket{bound, count})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no series %s{%s} in the metrics", metric, labels)
	}
	slices.SortFunc(out, func(a, b Bucket) int { return cmpFloat(a.UpperBound, b.UpperBound) })
	return out, nil
}

func labelValue(line, name string) (string, bool) {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return "", false
	}
	v, _, ok := strings.Cut(rest, `"`)
	return v, ok
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Delta is after minus before, bucket by bucket: the observations in between.
func Delta(after, before []Bucket) ([]Bucket, error) {
	if len(after) != len(before) {
		return nil, fmt.Errorf("the histogram's buckets changed (%d, then %d)", len(before), len(after))
	}
	out := make([]Bucket, len(after))
	for i := range after {
		if after[i].UpperBound != before[i].UpperBound {
			return nil, fmt.Errorf("the histogram's buckets changed at %d", i)
		}
		out[i] = Bucket{after[i].UpperBound, after[i].Count - before[i].Count}
	}
	return out, nil
}

// HistogramQuantile estimates the q-quantile, in milliseconds, as Prometheus's
// histogram_quantile does: it finds the bucket holding rank q×total and
// interpolates linearly between its bounds (0 below the first bucket). A rank
// in the +Inf bucket yields the largest finite bound, with above set. NaN if
// the histogram is empty.
func HistogramQuantile(buckets []Bucket, q float64) (ms float64, above bool) {
	if len(buckets) == 0 || buckets[len(buckets)-1].Count == 0 {
		return math.NaN(), false
	}
	rank := q * buckets[len(buckets)-1].Count
	lower, below := 0.0, 0.0
	for _, b := range buckets {
		if b.Count >= rank {
			if math.IsInf(b.UpperBound, 1) {
				return lower * 1000, true
			}
			inBucket := b.Count - below
			if inBucket == 0 {
				return b.UpperBound * 1000, false
			}
			return (lower + (b.UpperBound-lower)*(rank-below)/inBucket) * 1000, false
		}
		lower, below = b.UpperBound, b.Count
	}
	return lower * 1000, true
}
