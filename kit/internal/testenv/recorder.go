package testenv

import (
	"fmt"
	"testing"
)

// Recorder stands for a test in the test of a check (servicetest.CheckWrites,
// a fault scenario's Check): it keeps what the check reports with Errorf
// instead of failing; everything else goes to the test it wraps.
type Recorder struct {
	testing.TB
	Errors []string
}

// Errorf records the failure.
func (r *Recorder) Errorf(format string, args ...any) {
	r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
}
