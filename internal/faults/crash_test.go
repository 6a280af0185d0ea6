package faults

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func newTestCrasher() (*Crasher, *int) {
	deaths := 0
	return &Crasher{armed: map[Point]arming{}, die: func(Point) { deaths++ }}, &deaths
}

func TestArmedOnceFiresOnce(t *testing.T) {
	c, deaths := newTestCrasher()
	if err := c.Arm(AfterCommit, 0); err != nil {
		t.Fatal(err)
	}
	c.Hit(AfterAck)
	c.Hit(AfterCommit)
	c.Hit(AfterCommit)
	if *deaths != 1 {
		t.Fatalf("died %d times, want once at the armed point", *deaths)
	}
}

func TestProbabilityOneAlwaysFires(t *testing.T) {
	c, deaths := newTestCrasher()
	if err := c.Arm(AfterInboxInsert, 1); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c.Hit(AfterInboxInsert)
	}
	c.Disarm()
	c.Hit(AfterInboxInsert)
	if *deaths != 5 {
		t.Fatalf("died %d times, want 5", *deaths)
	}
}

func TestNilCrasherNeverFires(t *testing.T) {
	var c *Crasher
	c.Hit(AfterAck) // must not panic
}

func TestHandler(t *testing.T) {
	tests := []struct {
		method, target string
		want           int
	}{
		{"POST", "/faults/crash?at=after-commit", http.StatusNoContent},
		{"POST", "/faults/crash?at=after-gateway-charge&probability=0.5", http.StatusNoContent},
		{"POST", "/faults/crash?at=before-lunch", http.StatusBadRequest},
		{"POST", "/faults/crash?at=after-ack&probability=2", http.StatusBadRequest},
		{"POST", "/faults/crash?at=after-ack&probability=often", http.StatusBadRequest},
		{"DELETE", "/faults/crash", http.StatusNoContent},
		{"GET", "/faults/crash", http.StatusMethodNotAllowed},
	}
	c, _ := newTestCrasher()
	h := c.Handler()
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.target, strings.NewReader("")))
		if rec.Code != tt.want {
			t.Errorf("%s %s = %d, want %d (%s)", tt.method, tt.target, rec.Code, tt.want, rec.Body)
		}
	}
}
