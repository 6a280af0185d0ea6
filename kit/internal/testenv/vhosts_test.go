package testenv

import (
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestMain(m *testing.M) { os.Exit(RunMain(m)) }

// A pooled vhost is the test's own and usable at once; once its test has
// ended it is deleted with the next batch, not left behind.
func TestPooledVHostsAreUsableThenDeletedWithTheNextBatch(t *testing.T) {
	vhosts := func() []string { return strings.Fields(Ctl(t, "-q", "list_vhosts", "name")) }
	var first string
	t.Run("first", func(t *testing.T) {
		u := VHost(t)
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		first = strings.TrimPrefix(parsed.Path, "/")
		conn, err := amqp.Dial(u)
		if err != nil {
			t.Fatalf("dial the pooled vhost: %v", err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("q", true, false, false, false, nil); err != nil {
			t.Fatalf("declare on the pooled vhost: %v", err)
		}
	})
	if !slices.Contains(vhosts(), first) {
		t.Fatalf("%s is gone before the next batch: was it pooled?", first)
	}
	taken := map[string]bool{first: true}
	for range vhostBatch { // the rest of the batch, then one of the next
		t.Run("next", func(t *testing.T) {
			u, err := url.Parse(VHost(t))
			if err != nil {
				t.Fatal(err)
			}
			v := strings.TrimPrefix(u.Path, "/")
			if taken[v] {
				t.Fatalf("%s handed out twice", v)
			}
			taken[v] = true
		})
	}
	if slices.Contains(vhosts(), first) {
		t.Errorf("%s outlived the next batch", first)
	}
}

// In CI the batches go through erl_call, not a rabbitmqctl VM each: the
// machine has Erlang's erl_call and the broker's cookie (root reads the
// rabbitmq user's). Elsewhere the node is used where it is found; either
// way, a batch is the broker's own.
func TestBatchesReachTheBrokersNodeByErlCall(t *testing.T) {
	if _, ok := localNode(); !ok {
		if os.Getenv("CI") == "true" {
			t.Fatal("erl_call does not reach the broker's node in CI: every batch would boot a rabbitmqctl VM")
		}
		t.Logf("erl_call does not reach the broker's node here: the batches go through rabbitmqctl")
		return
	}
	u, err := url.Parse(getenv(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/"))
	if err != nil {
		t.Fatal(err)
	}
	v := Name(namePrefix(t))
	t.Cleanup(func() { _ = vhostEval([]string{v}, nil, "") })
	if err := vhostEval(nil, []string{v}, u.User.Username()); err != nil {
		t.Fatal(err)
	}
	// Again: a batch done in part before (erl_call lost on the way, then
	// rabbitmqctl) adds what exists without failing.
	if err := vhostEval(nil, []string{v}, u.User.Username()); err != nil {
		t.Fatalf("a vhost that exists, added again: %v", err)
	}
	if !slices.Contains(strings.Fields(Ctl(t, "-q", "list_vhosts", "name")), v) {
		t.Fatalf("vhost %s added by erl_call is not the broker's", v)
	}
	if err := vhostEval([]string{v}, nil, ""); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(strings.Fields(Ctl(t, "-q", "list_vhosts", "name")), v) {
		t.Fatalf("vhost %s deleted by erl_call is still listed", v)
	}
}
