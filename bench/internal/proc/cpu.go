package proc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc: the kernel reports them in
// USER_HZ ticks, 100 per second on every Linux architecture Go runs on
// (the value of sysconf(_SC_CLK_TCK)).
const userHZ = 100

func ticks(n uint64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// CPU is the CPU time (user and system) the process has used so far.
func (p *Process) CPU() (time.Duration, error) { return PidCPU(p.cmd.Process.Pid) }

// PidCPU is the CPU time (user and system) of one process, from
// /proc/PID/stat.
func PidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after its closing parenthesis start with field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseUint(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return ticks(utime + stime), nil
}

// CommandCPU sums the CPU time of every running process whose command name
// (/proc/PID/comm) is name: all of PostgreSQL's processes ("postgres"), the
// broker's Erlang VM ("beam.smp"). A process that ended meanwhile is not
// counted: sample before and after a window while the servers' processes
// live through it (pooled connections do).
func CommandCPU(name string) (time.Duration, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, d := range dirs {
		comm, err := os.ReadFile(d + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != name {
			continue // gone meanwhile, or another program
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if c, err := PidCPU(pid); err == nil {
			total += c
		}
	}
	return total, nil
}

// MachineCPU is the time all CPUs together spent busy since boot (the
// first line of /proc/stat: everything but idle and iowait).
func MachineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	var busy uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q", line)
		}
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is counted in user already.
		switch i {
		case 3, 4, 8, 9:
		default:
			busy += n
		}
	}
	return ticks(busy), nil
}
