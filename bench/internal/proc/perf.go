package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// Instructions counts the instructions a running process retires, with
// `perf stat -e instructions -p PID` (every thread of the process), where the
// machine lets perf read the hardware counter: many virtual machines do not.
type Instructions struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// ProbeInstructions reports why instructions cannot be counted here, or nil.
func ProbeInstructions() error {
	path, err := exec.LookPath("perf")
	if err != nil {
		return errors.New("perf is not installed")
	}
	out, err := exec.Command(path, "stat", "-x,", "-e", "instructions", "--", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("perf stat failed: %v: %s", err, firstLine(string(out)))
	}
	if _, err := parsePerfCSV(string(out)); err != nil {
		return err
	}
	return nil
}

// CountInstructions starts counting the instructions of the process.
func (p *Process) CountInstructions() (*Instructions, error) {
	c := &Instructions{}
	c.cmd = exec.Command("perf", "stat", "-x,", "-e", "instructions", "-p", strconv.Itoa(p.cmd.Process.Pid))
	c.cmd.Stderr = &c.out // perf stat writes its counts to stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start perf stat: %w", err)
	}
	return c, nil
}

// Stop ends the count (perf prints it on SIGINT) and returns it.
func (c *Instructions) Stop() (uint64, error) {
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	_ = c.cmd.Wait() // perf exits non-zero after a signal
	return parsePerfCSV(c.out.String())
}

// parsePerfCSV reads the instructions count from perf stat's -x, output:
// "1234567,,instructions,…", or "<not supported>,,instructions,…".
func parsePerfCSV(out string) (uint64, error) {
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || !strings.HasPrefix(f[2], "instructions") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("perf stat counts no instructions here (%q): the hardware counter is not available, as on many virtual machines", strings.TrimSpace(f[0]))
		}
		return n, nil
	}
	return 0, fmt.Errorf("perf stat printed no instructions count: %s", firstLine(out))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
