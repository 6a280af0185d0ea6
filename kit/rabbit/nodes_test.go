package rabbit

import (
	"strings"
	"testing"
	"time"
)

func TestParseNodes(t *testing.T) {
	for _, tt := range []struct {
		in    string
		addrs string // "" means refused
	}{
		{"amqp://guest:guest@localhost:5672/", "localhost:5672"},
		{"amqps://u:p@broker/vh", "broker:5671"},
		{"amqp://u:p@a:5681/vh, amqp://u:p@b:5682/vh,amqp://u:p@c/vh", "a:5681,b:5682,c:5672"},
		{"amqp://u:p@a:5681/vh,", ""},
		{"amqp://u:p@a:5681/vh,amqp://u:p@b:5682/other", ""},
		{"amqp://u:p@a:5681/vh,amqp://v:p@b:5682/vh", ""},
		{"http://a:5672/", ""},
		{"localhost:5672", ""},
		{"amqp:///vh", ""},
		{"amqp://u:p@a:5681/vh,amqps://u:p@b:5682/vh", ""}, // TLS to some nodes only
		{"amqp://u:p@a/vh,amqp://u:p@a:5672/vh", ""},       // one node twice
		{"amqp://u:p@a:5681/vh,,amqp://u:p@b:5682/vh", ""},
		{"amqp://u:p@a:5681/vh,u:p@b:5682/vh", ""}, // no scheme: url.Parse reads "u" as one
		{"u:p@b:5682/vh", ""},
	} {
		n, err := ParseNodes(tt.in)
		switch {
		case tt.addrs == "" && err == nil:
			t.Errorf("ParseNodes(%q) = %s, want an error", tt.in, n)
		case tt.addrs != "" && err != nil:
			t.Errorf("ParseNodes(%q): %v", tt.in, err)
		case err == nil && n.String() != tt.addrs:
			t.Errorf("ParseNodes(%q) = %s, want %s", tt.in, n, tt.addrs)
		case err != nil && strings.Contains(err.Error(), ":p@"):
			t.Errorf("ParseNodes(%q): the error shows the password: %v", tt.in, err)
		}
	}
}

// A dial passes over the nodes that refuse, starts with the node the last
// connection went to, and after a Lost with the one after it. The nodes here
// are closed ports: no broker is needed to see the order they are tried in.
func TestNodesDialOrder(t *testing.T) {
	n, err := ParseNodes("amqp://u:p@127.0.0.1:1/,amqp://u:p@127.0.0.1:2/,amqp://u:p@127.0.0.1:3/")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = n.Dial(time.Second, "t")
	if err == nil {
		t.Fatal("dialled a closed port")
	}
	for _, node := range []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"} {
		if !strings.Contains(err.Error(), "node "+node) {
			t.Errorf("the error does not name %s: %v", node, err)
		}
	}
	if strings.Index(err.Error(), "127.0.0.1:2") > strings.Index(err.Error(), "127.0.0.1:3") {
		t.Errorf("nodes not tried in turn: %v", err)
	}
	// Every node refused and passed the next dial on: a full turn, back at node 1.
	n.Lost("127.0.0.1:3") // not the next node: nothing moves
	if _, _, err = n.Dial(time.Second, "t"); !strings.HasPrefix(err.Error(), "dial broker: node 127.0.0.1:1") {
		t.Errorf("second dial: %v", err)
	}
	n.next = 0
	n.Lost("127.0.0.1:1")
	if _, _, err = n.Dial(time.Second, "t"); !strings.HasPrefix(err.Error(), "dial broker: node 127.0.0.1:2") {
		t.Errorf("after node 1 was lost the dial did not start at node 2: %v", err)
	}
}
