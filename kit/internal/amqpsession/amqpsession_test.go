package amqpsession

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

func TestBackoffDoublesWithJitterUpToItsCeilingAndStartsOver(t *testing.T) {
	b := NewBackoff(100*time.Millisecond, time.Second)
	for round := range 2 {
		cur := 100 * time.Millisecond
		for range 8 {
			d := b.Next()
			if d < cur/2 || d > cur {
				t.Fatalf("round %d: a wait of %s, want one in [%s, %s]", round, d, cur/2, cur)
			}
			cur = min(2*cur, time.Second)
		}
		b.Reset()
	}
}

func TestLoopOpensTheNextSessionAfterItsAfter(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sessions, afters int
	err := Loop(ctx, NewBackoff(time.Millisecond, time.Millisecond), func(context.Context) error {
		sessions++
		if sessions == 3 {
			cancel() // a stop: the loop ends without calling after
		}
		return errors.New("connection lost")
	}, func(err error) error {
		afters++
		if err == nil || err.Error() != "connection lost" {
			t.Errorf("after was told %v, want the session's error", err)
		}
		return nil
	})
	if err != nil || sessions != 3 || afters != 2 {
		t.Fatalf("Loop = %v after %d sessions and %d afters, want nil after 3 and 2", err, sessions, afters)
	}
}

func TestLoopEndsWithTheErrorOfAfter(t *testing.T) {
	fatal := errors.New("the broker holds the topology with other arguments")
	sessions := 0
	err := Loop(context.Background(), NewBackoff(time.Millisecond, time.Millisecond), func(context.Context) error {
		sessions++
		return fatal
	}, func(err error) error { return err })
	if !errors.Is(err, fatal) || sessions != 1 {
		t.Fatalf("Loop = %v after %d sessions, want the fatal error after one", err, sessions)
	}
	// The same error while the loop is being stopped is the stop's: nil.
	ctx, cancel := context.WithCancel(context.Background())
	err = Loop(ctx, NewBackoff(time.Millisecond, time.Millisecond), func(context.Context) error { return nil },
		func(error) error { cancel(); return ctx.Err() })
	if err != nil {
		t.Fatalf("Loop stopped during after = %v, want nil", err)
	}
}

func TestLoopStartsTheBackoffOverAfterALongSession(t *testing.T) {
	clock := time.Unix(0, 0)
	now = func() time.Time { return clock }
	defer func() { now = time.Now }()
	b := NewBackoff(time.Millisecond, time.Hour)
	for range 10 {
		b.Next() // cur is 1.024 s now
	}
	sessions := 0
	var waits []time.Duration
	_ = Loop(context.Background(), b, func(context.Context) error {
		sessions++
		if sessions == 2 {
			clock = clock.Add(resetAfter + time.Second) // one that lasted
		}
		return nil
	}, func(error) error {
		waits = append(waits, b.Next())
		if len(waits) == 2 {
			return errors.New("enough")
		}
		return nil
	})
	if len(waits) != 2 || waits[0] < 512*time.Millisecond || waits[1] > time.Millisecond {
		t.Fatalf("waits %v, want the first after a short session long (about 1 s) and the next after a long one back at the base (1 ms)", waits)
	}
}

func TestBlockedReleasesItsWaitersWhenUnblocked(t *testing.T) {
	b := &Blocked{done: make(chan struct{})}
	if b.Until() != nil || b.WaitUnblocked(context.Background()) != nil {
		t.Fatal("a connection never blocked reads as blocked")
	}
	b.set(true)
	waited := make(chan error, 1)
	go func() { waited <- b.WaitUnblocked(context.Background()) }()
	select {
	case err := <-waited:
		t.Fatalf("WaitUnblocked returned %v while blocked", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.set(false)
	if err := <-waited; err != nil {
		t.Fatalf("WaitUnblocked = %v after the unblock, want nil", err)
	}
	b.set(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.WaitUnblocked(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitUnblocked with its context ended = %v, want context.Canceled", err)
	}
}

// On a real connection: the watch ends when the connection closes, and
// leaves nothing blocked behind it.
func TestWatchBlockedEndsWithItsConnection(t *testing.T) {
	conn, err := amqp.Dial(testenv.VHost(t))
	if err != nil {
		t.Fatal(err)
	}
	b := WatchBlocked(conn, func(amqp.Blocking) {})
	b.set(true) // as if the broker had blocked it
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Done():
	case <-time.After(time.Minute):
		t.Fatal("the watch did not end a minute after its connection closed")
	}
	if b.Until() != nil {
		t.Fatal("the closed connection still reads as blocked: its waiters would wait forever")
	}
}

// A connection that closes while the broker blocks it tells its watcher it
// is no longer blocked (the consumer's consumer_publishing_blocked gauge
// follows it: it stayed 1 after a blocked connection died, until the next
// session was blocked and unblocked again); one that closes unblocked tells
// nothing more.
func TestWatchTellsAnUnblockWhenABlockedConnectionCloses(t *testing.T) {
	for _, tc := range []struct {
		notes []amqp.Blocking
		want  []amqp.Blocking
	}{
		{[]amqp.Blocking{{Active: true, Reason: "low on memory"}},
			[]amqp.Blocking{{Active: true, Reason: "low on memory"}, {Active: false, Reason: "the connection closed"}}},
		{[]amqp.Blocking{{Active: true, Reason: "low on memory"}, {Active: false}},
			[]amqp.Blocking{{Active: true, Reason: "low on memory"}, {Active: false}}},
		{nil, nil},
	} {
		b := &Blocked{done: make(chan struct{})}
		notes := make(chan amqp.Blocking, len(tc.notes))
		for _, n := range tc.notes {
			notes <- n
		}
		close(notes) // the library closes it with the connection
		var got []amqp.Blocking
		b.follow(notes, func(n amqp.Blocking) { got = append(got, n) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("notes %v, then the close: changed was told %v, want %v", tc.notes, got, tc.want)
		}
		if b.Until() != nil {
			t.Errorf("notes %v, then the close: still reads as blocked", tc.notes)
		}
		select {
		case <-b.Done():
		default:
			t.Errorf("notes %v, then the close: the watch is not done", tc.notes)
		}
	}
}

func TestNodesTellAFailover(t *testing.T) {
	var n Nodes
	for i, step := range []struct{ node, from string }{
		{"a:5672", ""},       // the first session
		{"a:5672", ""},       // the same node again
		{"b:5672", "a:5672"}, // a failover
		{"b:5672", ""},
	} {
		if from := n.Connected(step.node); from != step.from {
			t.Errorf("session %d on %s: failover from %q, want %q", i, step.node, from, step.from)
		}
	}
	if n.Last() != "b:5672" {
		t.Errorf("Last = %q, want b:5672", n.Last())
	}
}
