package proc

import (
	"strings"
	"testing"
)

func TestParsePerfCSVReadsTheCountOrSaysWhyNot(t *testing.T) {
	n, err := parsePerfCSV("\n1234567,,instructions:u,1002003,100.00,,\n")
	if err != nil || n != 1234567 {
		t.Fatalf("got %d, %v; want 1234567", n, err)
	}
	if _, err := parsePerfCSV("<not supported>,,instructions,0,100.00,,\n"); err == nil || !strings.Contains(err.Error(), "not available") {
		t.Fatalf("a counter perf does not support: err %v, want one saying it is not available", err)
	}
	if _, err := parsePerfCSV("Error: no permission\n"); err == nil || !strings.Contains(err.Error(), "no permission") {
		t.Fatalf("perf's own error: err %v, want it quoted", err)
	}
}
