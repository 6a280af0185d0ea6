package erlnode

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
	if v, err := n.Result(`ok = nope.`); err == nil || errors.Is(err, ErrNotReached) {
		t.Fatalf("a badmatch read as the value %q, or as no answer (%v)", v, err)
	}
	if _, err := (Node{name: "nobody@localhost", home: n.home}).Result(`ok.`); !errors.Is(err, ErrNotReached) {
		t.Fatalf("a node that is not there: %v, want ErrNotReached", err)
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

// Text returns the value's bytes exactly, however long, whatever they are:
// erl_call alone cuts a binary short and leaves a string's quotes bare (and
// past 65,535 characters prints the base64 as a list of integers).
func TestTextKeepsEveryByte(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	for _, want := range []string{"", `say "hi" \ back`, "tab\tnew\nline", "café ☕", strings.Repeat("x", 5000), strings.Repeat("é", 60000)} {
		got, err := n.Text(Binary(want))
		if err != nil || got != want {
			t.Errorf("Text(Binary(%.40q)) = %.40q, %v", want, got, err)
		}
	}
}

// Eval prints a value as rabbitmqctl eval does: callers read either.
func TestEvalPrintsAsRabbitmqctlEval(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	for _, expr := range []string{`{absolute, 1073741824}.`, `rabbit_misc:version().`, `X = 0.4, {X, [a, <<"b">>], "c"}.`} {
		got, err := n.Eval(expr)
		if err != nil {
			t.Fatal(err)
		}
		want, err := exec.Command("rabbitmqctl", "-q", "eval", expr).CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqctl eval %s: %v: %s", expr, err, want)
		}
		if got != strings.TrimSpace(string(want)) {
			t.Errorf("Eval(%s) = %q, rabbitmqctl eval printed %q", expr, got, want)
		}
	}
}

// Queues lists what rabbitmqctl list_queues lists, a quorum queue and a
// classic one with their counts and consumers.
func TestQueuesListsWhatRabbitmqctlLists(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	vhost := testVHost(t, n)
	ch := dial(t, vhost)
	if _, err := ch.QueueDeclare("qq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("cq", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"qq", "cq", "cq"} {
		if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ch.Consume("cq", "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	parse := func(s string) map[string]map[string]any {
		var rows []map[string]any
		if err := json.Unmarshal([]byte(s[strings.Index(s, "["):]), &rows); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
		m := map[string]map[string]any{}
		for _, r := range rows {
			m[fmt.Sprint(r["name"])] = r
		}
		return m
	}
	// The counts are the broker's statistics, refreshed every few seconds:
	// the two listings agree once both show the messages.
	var got, want map[string]map[string]any
	deadline := time.Now().Add(time.Minute)
	for {
		js, err := n.Queues(vhost)
		if err != nil {
			t.Fatal(err)
		}
		got = parse(js)
		out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "-p", vhost, "--formatter", "json",
			"name", "messages", "messages_ready", "messages_unacknowledged", "consumers", "leader").CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqctl list_queues: %v: %s", err, out)
		}
		want = parse(string(out))
		if reflect.DeepEqual(got, want) && got["qq"]["messages"] == 1.0 && got["cq"]["messages"] == 2.0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Queues listed %v, rabbitmqctl %v (want qq 1 message, cq 2)", got, want)
		}
		time.Sleep(time.Second)
	}
	if got["cq"]["consumers"] != 1.0 || got["qq"]["leader"] != n.Name() {
		t.Errorf("listed %v: want cq's consumer and qq led by %s", got, n.Name())
	}
}

// CloseConnections closes the vhost's connections with the reason given,
// and no other vhost's.
func TestCloseConnectionsClosesTheVHostsAlone(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	target, other := testVHost(t, n), testVHost(t, n)
	closed := dial(t, target).NotifyClose(make(chan *amqp.Error, 1))
	otherCh := dial(t, other)
	otherClosed := otherCh.NotifyClose(make(chan *amqp.Error, 1))
	if err := n.CloseConnections(target, "erlnode test: closed"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-closed:
		if err == nil || !strings.Contains(err.Reason, "erlnode test: closed") {
			t.Errorf("the connection closed with %v, want the reason given", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the vhost's connection was not closed")
	}
	// A round trip on the other vhost's connection, after the close: it
	// answers only if the broker left it open.
	if _, err := otherCh.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Errorf("another vhost's connection was closed too: %v", err)
	}
	select {
	case err := <-otherClosed:
		t.Errorf("another vhost's channel was closed: %v", err)
	default:
	}
}

// At reaches a named node of this machine, and no node that is not there.
func TestAtReachesANamedNode(t *testing.T) {
	n, ok := machineNode(t)
	if !ok {
		return
	}
	if m, ok := At(n.Name()); !ok || m.Name() != n.Name() {
		t.Errorf("At(%s) did not reach it", n.Name())
	}
	if _, ok := At("nobody@localhost"); ok {
		t.Error("At reached a node that does not run")
	}
}

// testVHost adds a vhost with guest's permissions for the test, deleted at
// its end.
func testVHost(t *testing.T, n Node) string {
	t.Helper()
	v := fmt.Sprintf("erlnode_test_%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := n.Result(`ok = rabbit_vhost:add(` + Binary(v) + `, <<"erlnode test">>), ok = rabbit_auth_backend_internal:set_permissions(<<"guest">>, ` +
		Binary(v) + `, <<".*">>, <<".*">>, <<".*">>, <<"erlnode test">>).`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := n.Result(`rabbit_vhost:delete(` + Binary(v) + `, <<"erlnode test">>).`); err != nil {
			t.Error(err)
		}
	})
	return v
}

// dial opens a channel on vhost, closed at the test's end.
func dial(t *testing.T, vhost string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/" + url.PathEscape(vhost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}
