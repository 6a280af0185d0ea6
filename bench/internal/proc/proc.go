// Package proc runs the programs under test as child processes: with a clean
// environment, output to a log file, killed if the bench dies, and with their
// peak resident memory read from /proc before they stop.
package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a running program.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	log     *os.File
	done    chan struct{}
	err     error // the exit status, once done is closed
}

// Start runs path with args and env (NAME=value; nothing else is inherited
// but PATH and HOME), its stdout and stderr appended to logPath.
func Start(name, path string, args, env []string, logPath string) (*Process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the log of %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	cmd.Stdout, cmd.Stderr = log, log
	// A bench killed half way must not leave consumers behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.done }

// ExitError describes how the process ended, once Exited is closed.
func (p *Process) ExitError() error {
	if p.err == nil {
		return fmt.Errorf("%s exited with status 0", p.Name)
	}
	return fmt.Errorf("%s: %w (log: %s)", p.Name, p.err, p.LogPath)
}

// PeakRSS is the process's peak resident set size in bytes (VmHWM).
func (p *Process) PeakRSS() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("read the status of %s: %w", p.Name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse VmHWM of %s: %q", p.Name, v)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in the status of %s", p.Name)
}

// Stop sends SIGTERM and waits up to grace for the exit, then kills. It
// returns nil if the process exited by itself with status 0.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	fmt.Fprintf(p.log, "{\"bench\":\"SIGTERM sent at %s\"}\n", time.Now().UTC().Format(time.RFC3339Nano))
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.exitErr()
	case <-timer.C:
	case <-ctx.Done():
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not stop within %s after SIGTERM: killed (log: %s)", p.Name, grace, p.LogPath)
}

func (p *Process) exitErr() error {
	if p.err == nil {
		return nil
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) {
		return fmt.Errorf("%s exited with %v (log: %s)", p.Name, exit, p.LogPath)
	}
	return fmt.Errorf("%s: %w", p.Name, p.err)
}

// Tail is the last n lines of the process's log, for an error message.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
