package proc

import (
	"os"
	"testing"
	"time"
)

// The CPU readers see this process burn CPU: its own time grows by about
// what it spun, and so does the machine's.
func TestCPUReadersSeeWorkDone(t *testing.T) {
	own0, err := PidCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	m0, err := MachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	own1, _ := PidCPU(os.Getpid())
	m1, _ := MachineCPU()
	if d := own1 - own0; d < 100*time.Millisecond {
		t.Errorf("own CPU grew %s over a 300ms spin", d)
	}
	if d := m1 - m0; d < 100*time.Millisecond {
		t.Errorf("machine CPU grew %s over a 300ms spin", d)
	}
	name, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	c, err := CommandCPU(string(name[:len(name)-1]))
	if err != nil || c < own1 {
		t.Errorf("CommandCPU of this program: %s (%v), want at least its own %s", c, err, own1)
	}
}
