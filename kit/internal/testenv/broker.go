package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest/erlnode"
)

// The questions and faults the tests put to the machine's broker often (a
// vhost's queues, its connections closed, an expression evaluated, the
// broker application stopped and started) go to its node through erl_call
// where it reaches it (localNode): about 15 ms of CPU a call, where each
// rabbitmqctl call boots an Erlang VM (about 1 s of CPU, and up to 30 s of
// a test's time on a machine loaded by a fault test). Otherwise they go
// through rabbitmqctl, as before; so does a question or an idempotent
// change (permissions, the broker application started) whose erl_call
// failed, but not the closing of connections, which may have happened
// before the failure: that fails the test.

// Queue is a queue of a vhost as the broker lists it.
type Queue struct {
	Name string
	// Counted: the broker gave the queue's counts. A quorum queue without a
	// leader (an election under way, or a leader just killed) has none: it
	// is not known to be empty.
	Counted                             bool
	Messages, Ready, Unacked, Consumers int
	Leader                              string // a quorum queue's leading node
}

// queueColumns are list_queues' columns that Queues reads.
var queueColumns = []string{"name", "messages", "messages_ready", "messages_unacknowledged", "consumers", "leader"}

// Queues lists the queues of vhost on the tests' broker.
func Queues(t testing.TB, vhost string) []Queue {
	t.Helper()
	out, err := queuesJSON(vhost)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := ParseQueues(out)
	if err != nil {
		t.Fatalf("list_queues -p %s: %v", vhost, err)
	}
	return qs
}

func queuesJSON(vhost string) (string, error) {
	if n, ok := localNode(); ok {
		out, err := n.Queues(vhost)
		if err == nil {
			return out, nil
		}
		fmt.Fprintf(os.Stderr, "testenv: list the queues through erl_call: %v: through rabbitmqctl\n", err)
	}
	return ctl(time.Minute, append([]string{"list_queues", "-p", vhost, "-q", "--formatter", "json"}, queueColumns...)...)
}

// ParseQueues reads the queues from the JSON of rabbitmqctl list_queues
// --formatter json with Queue's columns (or erlnode.Node.Queues'). A count
// that is not a number or is missing (a quorum queue without a leader:
// list_queues prints "", erlnode leaves out a queue's columns when its
// node does not answer) leaves the queue not counted.
func ParseQueues(out string) ([]Queue, error) {
	var raw []map[string]any
	// The JSON alone: rabbitmqctl's output may hold a warning besides.
	i, j := strings.Index(out, "["), strings.LastIndex(out, "]")
	if i < 0 || j < i || json.Unmarshal([]byte(out[i:j+1]), &raw) != nil {
		return nil, fmt.Errorf("no list of queues in:\n%s", out)
	}
	qs := make([]Queue, 0, len(raw))
	for _, r := range raw {
		q := Queue{Name: fmt.Sprint(r["name"]), Counted: true}
		if l, ok := r["leader"].(string); ok {
			q.Leader = l
		}
		counts := []*int{&q.Messages, &q.Ready, &q.Unacked, &q.Consumers}
		for k, key := range queueColumns[1:5] {
			f, ok := r[key].(float64)
			if !ok {
				q.Counted = false
				continue
			}
			*counts[k] = int(f)
		}
		qs = append(qs, q)
	}
	return qs, nil
}

// Eval evaluates expr (ended by a dot) on the tests' broker and returns its
// value as rabbitmqctl eval prints it. Where its erl_call fails, it runs
// again through rabbitmqctl eval: expr must be safe to run twice (a
// question, or a change that sets a value).
func Eval(t testing.TB, expr string) string {
	t.Helper()
	if n, ok := localNode(); ok {
		out, err := n.Eval(expr)
		if err == nil {
			return out
		}
		t.Logf("eval through erl_call: %v: through rabbitmqctl", err)
	}
	return strings.TrimSpace(Ctl(t, "-q", "eval", expr))
}

// CloseConnections makes the tests' broker close every connection of
// vhost, giving reason (rabbitmqctl close_all_connections -p vhost).
func CloseConnections(t testing.TB, vhost, reason string) {
	t.Helper()
	if n, ok := localNode(); ok {
		if err := n.CloseConnections(vhost, reason); err != nil {
			t.Fatalf("close the connections of %s through erl_call: %v", vhost, err)
		}
		return
	}
	Ctl(t, "close_all_connections", "-p", vhost, reason)
}

// StopApp stops the broker application of the tests' broker, its Erlang
// node left running (rabbitmqctl stop_app): every vhost stops. StartApp
// starts it again and waits until it has booted (start_app, await_startup).
func StopApp(t testing.TB) { brokerApp(t, "stop_app", "rabbit:stop().") }

// StartApp: see StopApp.
func StartApp(t testing.TB) {
	brokerApp(t, "start_app", "ok = rabbit:start(), rabbit:await_startup().")
}

func brokerApp(t testing.TB, command, expr string) {
	t.Helper()
	if n, ok := localNode(); ok {
		out, err := n.Result(expr)
		if err == nil && out == "ok" {
			return
		}
		t.Logf("%s through erl_call: %v (value %q): through rabbitmqctl", command, err, out)
	}
	Ctl(t, command)
	if command == "start_app" {
		Ctl(t, "await_startup")
	}
}

// queuesOn lists vhost's queues through erl_call on the first of nodes that
// answers; ok is false if none does.
func queuesOn(nodes []string, vhost string) (qs []Queue, ok bool) {
	for _, name := range nodes {
		n, ok := erlnode.At(name)
		if !ok {
			continue
		}
		out, err := n.Queues(vhost)
		if err != nil {
			continue
		}
		if qs, err := ParseQueues(out); err == nil {
			return qs, true
		}
	}
	return nil, false
}

// MemoryAlarm raises a memory alarm on the tests' broker (its memory
// watermark set to almost nothing) and waits until the broker has it: every
// connection that publishes blocks, on every vhost; only for tests that run
// alone. clear sets the watermark back; the test's cleanup does if the test
// has not.
func MemoryAlarm(t testing.TB) (clear func()) {
	t.Helper()
	w, err := watermarkOf(Eval(t, "vm_memory_monitor:get_vm_memory_high_watermark()."))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	clear = func() {
		once.Do(func() { Eval(t, "ok = vm_memory_monitor:set_vm_memory_high_watermark("+w+").") })
	}
	t.Cleanup(clear)
	Eval(t, "ok = vm_memory_monitor:set_vm_memory_high_watermark(0.000001).")
	// The memory monitor raises the alarm at its next check, not at once.
	Eventually(t, 30*time.Second, "the broker's memory alarm", func() (bool, error) {
		return strings.Contains(Eval(t, "rabbit_alarm:get_alarms()."), "memory"), nil
	})
	return clear
}

// watermarkOf is the broker's watermark as eval prints it (0.4, or
// {absolute,1073741824} when it was set in bytes), checked to be one of
// those: the argument of vm_memory_monitor:set_vm_memory_high_watermark
// that sets it again.
func watermarkOf(eval string) (string, error) {
	v := strings.TrimSpace(eval)
	if !watermarkValue.MatchString(v) {
		return "", fmt.Errorf("the broker's memory watermark %q is neither a fraction nor {absolute,Bytes} nor {absolute,\"1GB\"}: the test cannot set it back", v)
	}
	return v, nil
}

var watermarkValue = regexp.MustCompile(`^([0-9.]+(e-?[0-9]+)?|\{absolute,([0-9]+|"[0-9]+[A-Za-z]*")\})$`)

// SetPermissions sets user's permissions on vhost of the tests' broker
// (configure, write and read: regular expressions), as rabbitmqctl
// set_permissions does.
func SetPermissions(t testing.TB, vhost, user, configure, write, read string) {
	t.Helper()
	if n, ok := localNode(); ok {
		out, err := n.Result("rabbit_auth_backend_internal:set_permissions(" + erlnode.Binary(user) + ", " + erlnode.Binary(vhost) + ", " +
			erlnode.Binary(configure) + ", " + erlnode.Binary(write) + ", " + erlnode.Binary(read) + `, <<"testenv">>).`)
		if err == nil && out == "ok" {
			return
		}
		t.Logf("set_permissions through erl_call: %v (value %q): through rabbitmqctl", err, out)
	}
	Ctl(t, "set_permissions", "-p", vhost, user, configure, write, read)
}
