package faults

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A crash point must end the process even when it is PID 1, as in a container
// without an init, where the kernel drops every signal PID 1 has no handler
// for, a SIGKILL it sends itself included. The test runs itself again as PID 1
// of a new PID namespace (root only) and arms a point there.
func TestCrashPointEndsPID1(t *testing.T) {
	if os.Getenv("FAULTS_TEST_PID1") == "1" {
		if os.Getpid() != 1 {
			os.Exit(3)
		}
		c := NewCrasher()
		_ = c.Arm(AfterCommit, 0)
		c.Hit(AfterCommit)
		os.Exit(0) // not reached when the point works
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashPointEndsPID1$")
	cmd.Env = append(os.Environ(), "FAULTS_TEST_PID1=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) && os.Getenv("CI") == "" {
			t.Skip("a new PID namespace needs root; CI runs this test")
		}
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("PID 1 did not end at the armed crash point")
	}
	if code := cmd.ProcessState.ExitCode(); code != ExitCode {
		t.Fatalf("PID 1 ended with %v, want exit status %d", cmd.ProcessState, ExitCode)
	}
}
