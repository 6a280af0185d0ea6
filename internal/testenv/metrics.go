package testenv

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Metric scrapes http://addr/metrics and returns the sum of the samples of
// name whose labels include every pair of labels ("outcome", "processed",
// …): 0 when there is none yet (a counter not yet incremented has no sample).
func Metric(t testing.TB, addr, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("Metric %s: labels come in name, value pairs, got %q", name, labels)
	}
	resp, err := probe.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s", addr, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		metric, set, _ := strings.Cut(series, "{")
		if metric != name || !hasLabels(strings.TrimSuffix(set, "}"), labels) {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

// hasLabels reports whether the label set `a="x",b="y"` holds every pair.
func hasLabels(set string, pairs []string) bool {
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(","+set+",", ","+pairs[i]+"="+strconv.Quote(pairs[i+1])+",") {
			return false
		}
	}
	return true
}
