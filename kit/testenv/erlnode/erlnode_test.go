package erlnode

import (
	"fmt"
	"os"
	"testing"
)

// The node of the machine's broker answers with the broker's own values,
// and an expression that fails is an error, not a value.
func TestResultIsTheNodesValueAndAFailureAnError(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	if v, err := n.Result(`node().`); err != nil || v != n.Name() {
		t.Fatalf("node() = %q, %v; want %s", v, err, n.Name())
	}
	if v, err := n.Result(`ok = nope.`); err == nil {
		t.Fatalf("a badmatch read as the value %q", v)
	}
	if _, ok := Of("amqp://guest:guest@127.0.0.1:1/"); ok {
		t.Fatal("a node was found for a port it does not listen on")
	}
	if _, ok := Of("amqp://guest:guest@rabbit.example:5672/"); ok {
		t.Fatal("a node was found for a broker on another machine")
	}
}

// The node's name comes as rabbitmqctl finds it: RABBITMQ_NODENAME first.
func TestNameFollowsRabbitMQNodename(t *testing.T) {
	t.Setenv("RABBITMQ_NODENAME", "rabbit@elsewhere")
	if n := name(); n != "rabbit@elsewhere" {
		t.Fatalf("name() = %q, want rabbit@elsewhere", n)
	}
}

// Calls at once all get through: test binaries side by side ask the same
// node. (Without -R every erl_call was c17@host, and a review saw 7 of 20
// calls at once refused.)
func TestCallsAtOnceAllGetThrough(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	errs := make(chan error, 20)
	for range cap(errs) {
		go func() {
			v, err := n.Result(`node().`)
			if err == nil && v != n.Name() {
				err = fmt.Errorf("node() = %q", v)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// machineNode is the node of the machine's broker (127.0.0.1:5672). Where
// erl_call does not reach it, a test fails in CI (the machine has erl_call
// and root reads the cookie) and says so elsewhere: ok is then false.
func machineNode(t *testing.T) (Node, bool) {
	t.Helper()
	n, ok := Of("amqp://guest:guest@127.0.0.1:5672/")
	if !ok {
		if os.Getenv("CI") == "true" {
			t.Fatal("erl_call does not reach the machine's broker in CI")
		}
		t.Log("erl_call does not reach the machine's broker here")
	}
	return n, ok
}
