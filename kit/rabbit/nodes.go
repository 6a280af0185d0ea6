package rabbit

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Nodes is the broker's address list: AMQP_URL holds one URL or, for a
// cluster, one per node separated by commas (a comma inside a password is
// written %2C). Every node must name the same user and vhost: they are one
// broker. Dial connects to the first node that answers, starting where the
// last connection went, so connections stay on one node while it lives and
// move on when it dies. Safe for concurrent use: one component's
// connections (the consumer's two, say) share one Nodes.
type Nodes struct {
	urls  []string
	addrs []string // host:port of each, for logs and metrics

	mu   sync.Mutex
	next int // the node the next dial tries first
}

// ParseNodes reads an AMQP_URL value: one amqp:// or amqps:// URL, or
// several separated by commas.
func ParseNodes(s string) (*Nodes, error) {
	n := &Nodes{}
	var first *url.URL
	for i, raw := range strings.Split(s, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		switch {
		case raw == "":
			return nil, fmt.Errorf("node %d is empty", i+1)
		case err != nil: // not err itself: it would print the password
			return nil, fmt.Errorf("node %d is not a URL", i+1)
		case u.Scheme != "amqp" && u.Scheme != "amqps":
			// Not Redacted: "user:pass@host" parses with the scheme "user"
			// and the password in its opaque part.
			return nil, fmt.Errorf("node %d (%s) is not an amqp or amqps URL", i+1, afterAt(raw))
		case u.Host == "":
			return nil, fmt.Errorf("node %d (%s) has no host", i+1, u.Redacted())
		case first != nil && u.Scheme != first.Scheme:
			return nil, fmt.Errorf("node %d (%s) is %s, node 1 (%s) is %s: TLS to some nodes only would send the password in clear to the others",
				i+1, u.Redacted(), u.Scheme, first.Redacted(), first.Scheme)
		case slices.Contains(n.addrs, address(u)):
			return nil, fmt.Errorf("node %d (%s) is listed twice", i+1, address(u))
		case first != nil && (u.Path != first.Path || u.User.Username() != first.User.Username()):
			return nil, fmt.Errorf("node %d (%s) names another user or vhost than node 1 (%s): the nodes of one broker share them",
				i+1, u.Redacted(), first.Redacted())
		}
		if first == nil {
			first = u
		}
		n.urls = append(n.urls, raw)
		n.addrs = append(n.addrs, address(u))
	}
	return n, nil
}

// afterAt is raw without what comes before its last "@" (a user and a
// password, if any), for an error about a value that is no URL we know.
func afterAt(raw string) string {
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		return "…@" + raw[i+1:]
	}
	return raw
}

// address is host:port, with AMQP's default port when the URL has none.
func address(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "amqps" {
		return u.Host + ":5671"
	}
	return u.Host + ":5672"
}

// Len is the number of nodes.
func (n *Nodes) Len() int { return len(n.urls) }

// String lists the nodes' addresses, for logs.
func (n *Nodes) String() string { return strings.Join(n.addrs, ",") }

// Dial connects to a node, trying each in turn from the one the last
// connection went to, and returns the connection and the node's address.
// A node that refuses or does not answer within the dial timeout is passed
// over: the next dial starts after it.
func (n *Nodes) Dial(heartbeat time.Duration, name string) (*amqp.Connection, string, error) {
	n.mu.Lock()
	start := n.next
	n.mu.Unlock()
	var errs []error
	for i := range n.urls {
		at := (start + i) % len(n.urls)
		conn, err := dialOne(n.urls[at], heartbeat, name)
		if err == nil {
			n.mu.Lock()
			n.next = at
			n.mu.Unlock()
			return conn, n.addrs[at], nil
		}
		n.passOver(at)
		errs = append(errs, fmt.Errorf("node %s: %w", n.addrs[at], err))
	}
	return nil, "", fmt.Errorf("dial broker: %w", errors.Join(errs...))
}

// Lost tells the list that a connection to node died (closed by the network
// or the broker, not by us): the next dial starts with the node after it,
// not waiting for a dead node's dial timeout first.
func (n *Nodes) Lost(node string) {
	for i, a := range n.addrs {
		if a == node {
			n.passOver(i)
		}
	}
}

// passOver moves the next dial past node at, unless another dial has moved
// it already.
func (n *Nodes) passOver(at int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.next == at {
		n.next = (at + 1) % len(n.urls)
	}
}

func dialOne(url string, heartbeat time.Duration, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	return amqp.DialConfig(url, amqp.Config{
		Heartbeat:  heartbeat,
		Properties: props,
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
}
