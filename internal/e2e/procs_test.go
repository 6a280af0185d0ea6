package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// bin holds the programs, built once for the package.
var bin string

func TestMain(m *testing.M) {
	// Every program of cmd/: the list lives in the directory. Built where
	// the next run of this package finds them up to date (kittest.Build).
	dir, err := kittest.Build("../../cmd/...")
	if err != nil {
		fmt.Fprintln(os.Stderr, "build programs:", err)
		os.Exit(1)
	}
	bin = dir
	os.Exit(kittest.RunMain(m)) // the vhosts in batches
}

// proc is a running program whose output is kept for the test log.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *kittest.Buffer
	done chan struct{}
	err  error
}

// start runs a program with env added to the test's environment. The process
// is killed at cleanup if the test has not stopped it; its output is logged if
// the test failed.
func start(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &kittest.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(bin, name), args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", name, p.out.String())
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// run runs a program to completion and returns its exit code and output.
func run(t *testing.T, timeout time.Duration, name string, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

func waitHTTP(t *testing.T, url string) {
	t.Helper()
	kittest.Eventually(t, 60*time.Second, url, func() (bool, error) {
		resp, err := http.Get(url)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}
