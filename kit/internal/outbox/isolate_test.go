package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// From an outside review: after the broker closed its channel on a bad
// row, a relay sent the rows left without a confirm one at a time, each
// waiting for its confirm, with no regard to their lease. On a link with
// some latency that outlived the lease: another relay took the rows over
// and published them, and the first went on publishing them too, a key's
// head after its successor. Now a row is sent alone only while its lease
// outlasts its confirm, and settled at once; the others go back.
//
// Scaled down: a publish timeout of 1 s, a lease of 3 s, 150 ms between the
// first relay and the broker, 201 rows to sort out (about a minute one at a
// time). The rule itself is TestIsolationGivesBackRowsWhoseLeaseIsEnding.
func TestIsolatingABadRowNeverOutlivesTheLease(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(e.amqp)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.Proxy(t, "amqp", u.Host)
	slow := *u
	slow.Host = proxy.Listen
	if _, err := e.emit(nil, Message{Exchange: "not-declared", RoutingKey: key, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	const keys, perKey = 200, 3
	for n := range perKey {
		msgs := make([]Message, keys)
		for k := range msgs {
			msgs[k] = Message{Exchange: exchange, RoutingKey: key, OrderingKey: fmt.Sprintf("k-%d", k),
				Body: fmt.Appendf(nil, `{"key":"k-%d","n":%d}`, k, n)}
		}
		if _, err := e.emit(nil, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	testenv.AddToxic(t, proxy, `{"name":"rtt","type":"latency","stream":"downstream","attributes":{"latency":150}}`)
	tune := func(c *RelayConfig) {
		c.PublishTimeout, c.Lease, c.Batch, c.MaxAttempts = time.Second, 3*time.Second, 100, 1000
	}
	first, _, _ := e.relay(slow.String(), tune)
	eventually(t, "the first relay's isolation under way", 30*time.Second, func() bool {
		return e.count("attempts > 0") > 0 && first.Ready() == nil
	})
	e.relay(e.amqp, tune) // a second replica, near the broker
	eventually(t, "every good row sent", 3*time.Minute, func() bool { return e.count("status = 'sent'") == keys*perKey })
	got := e.received(keys * perKey)
	type body struct {
		Key string `json:"key"`
		N   int    `json:"n"`
	}
	highest := map[string]int{}
	late := 0
	perID := map[string]int{}
	for _, d := range got {
		perID[d.MessageId]++
		var b body
		if err := json.Unmarshal(d.Body, &b); err != nil {
			t.Fatal(err)
		}
		if h, ok := highest[b.Key]; ok && b.N < h {
			late++
		}
		highest[b.Key] = max(highest[b.Key], b.N)
	}
	t.Logf("%d deliveries of %d rows; %d after a later row of their key", len(got), keys*perKey, late)
	// A row published twice (a confirm that did not come within the
	// second) is allowed, with its id; a head after its successor is not.
	if late > 0 {
		t.Errorf("%d deliveries of %d distinct rows, %d after their key's successor: two relays published one row at once",
			len(got), len(perID), late)
	}
}

// isolate publishes a row alone only while its lease outlasts the publish
// timeout; a row whose lease is ending goes back unpublished and unharmed
// (no attempt), the others are sent.
func TestIsolationGivesBackRowsWhoseLeaseIsEnding(t *testing.T) {
	e := newEnv(t)
	for i := range 3 {
		if _, err := e.emit(nil, event(i, "")); err != nil {
			t.Fatal(err)
		}
	}
	claimed, _, err := e.store.Claim(context.Background(), 3, time.Minute)
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claim: %d rows, %v", len(claimed), err)
	}
	claimed[1].leasedUntil = time.Now().Add(defaultPublishTimeout) // ends before a confirm could come, and a margin
	r, _, stop := e.relay(e.amqp, func(c *RelayConfig) { c.PollInterval = time.Hour })
	stop() // its store, config and metrics; the session below is the test's
	l, err := r.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	s := &session{r: r, l: l, win: newWindow(3)}
	s.c = r.startCompleter(s.win)
	rows := make([]inFlight, len(claimed))
	for i, c := range claimed {
		rows[i] = inFlight{c: c}
	}
	if err := s.isolate(rows, nil); err != nil {
		t.Fatal(err)
	}
	s.c.stop()
	got := e.received(2)
	if len(got) != 2 || got[0].MessageId == claimed[1].ID || got[1].MessageId == claimed[1].ID {
		t.Fatalf("published %d rows, want the two whose lease outlasts a confirm", len(got))
	}
	if n := e.count("id = ? AND status = 'pending' AND lease_token IS NULL AND attempts = 0 AND available_at <= now()", claimed[1].ID); n != 1 {
		t.Errorf("the row whose lease was ending was not given back unharmed")
	}
	if n := e.count("status = 'sent'"); n != 2 {
		t.Errorf("%d rows sent, want 2", n)
	}
}
