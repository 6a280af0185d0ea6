package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// verify --run-id finds the run's summary where the publisher left it
// (SUMMARY_DIR), with what the run sent; without one it says that the
// duplicates and poison it sent are unknown.
func TestRunIDFindsTheRunsSummary(t *testing.T) {
	dir := t.TempDir()
	summary := `{"run_id":"demo-1","orders":200,"published":256,"duplicates":43,"republishes":7,"poison_total":6}`
	if err := os.WriteFile(filepath.Join(dir, "demo-1.json"), []byte(summary), 0o644); err != nil {
		t.Fatal(err)
	}
	var notes strings.Builder
	runs, err := loadRuns(nil, "demo-1", 0, dir, &notes)
	if err != nil || len(runs) != 1 || runs[0].Orders != 200 || runs[0].Duplicates != 43 || runs[0].PoisonTotal != 6 || notes.Len() != 0 {
		t.Fatalf("loadRuns with the summary in SUMMARY_DIR = %+v, %v, %q; want the summary's figures", runs, err, notes.String())
	}
	if _, err := loadRuns(nil, "demo-1", 100, dir, &notes); err == nil || !strings.Contains(err.Error(), "published 200") {
		t.Errorf("--orders against the summary's: err = %v", err)
	}
	runs, err = loadRuns(nil, "other", 50, dir, &notes)
	if err != nil || len(runs) != 1 || runs[0].Orders != 50 || runs[0].Duplicates != 0 || !strings.Contains(notes.String(), "count as none") {
		t.Errorf("a run without a summary = %+v, %v, %q; want --orders and a note", runs, err, notes.String())
	}
	if _, err := loadRuns(nil, "other", 0, dir, &notes); err == nil || !strings.Contains(err.Error(), "--orders") {
		t.Errorf("a run without a summary nor --orders: err = %v", err)
	}
}
