// Package amqpsession is the kit's one supervisor of AMQP sessions: the loop
// that opens a session again after it ends, with capped exponential backoff
// and jitter, and the watch of a connection's blocked state (a resource
// alarm on the broker). The consumer runtime and the outbox relay each run
// their sessions in it; the node list a session dials is rabbit.Nodes.
package amqpsession

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/wait"
)

// FirstWait is the backoff's first wait before a session is opened again.
const FirstWait = 200 * time.Millisecond

// resetAfter is how long a session must have lasted for the backoff to
// start over: one that ends at once again and again waits longer each time.
const resetAfter = time.Minute

// now is the clock of Loop: a variable for the tests.
var now = time.Now

// Backoff is capped exponential backoff with jitter: each wait is drawn
// from [cur/2, cur], and cur doubles up to max.
type Backoff struct {
	base, max, cur time.Duration
}

// NewBackoff starts at base; after the first wait, cur doubles and is
// capped at ceiling.
func NewBackoff(base, ceiling time.Duration) *Backoff {
	return &Backoff{base: base, max: ceiling, cur: base}
}

// Next is the next wait.
func (b *Backoff) Next() time.Duration {
	d := b.cur/2 + rand.N(b.cur/2+1)
	b.cur = min(b.cur*2, b.max)
	return d
}

// Reset starts over at the base.
func (b *Backoff) Reset() { b.cur = b.base }

// Sleep waits d, or until ctx ends: it reports whether it waited all of d.
func Sleep(ctx context.Context, d time.Duration) bool { return wait.Sleep(ctx, d) }

// Loop runs session until ctx ends, and then returns nil. After each
// session that ends while ctx is live, after is told why and does what
// comes before the next one (count it, log it, wait b.Next() or longer):
// an error it returns ends the loop with that error (a fault no new
// session mends), unless ctx ended meanwhile. A session that lasted a
// minute resets b first.
func Loop(ctx context.Context, b *Backoff, session func(context.Context) error, after func(err error) error) error {
	for {
		started := now()
		err := session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if now().Sub(started) > resetAfter {
			b.Reset()
		}
		if err := after(err); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// Blocked follows whether the broker blocks a connection (connection.blocked:
// a memory or disk alarm stops it reading from every connection that
// publishes).
type Blocked struct {
	mu sync.Mutex
	// unblocked is closed when the broker unblocks the connection; nil
	// while it is not blocked.
	unblocked chan struct{}
	done      chan struct{}
}

// WatchBlocked follows conn's blocked state until conn closes, calling
// changed (if not nil) on each change the broker sends. When the connection
// closes, whoever waits for it to be unblocked is released (its session is
// over), and changed is told it is unblocked if it was blocked.
func WatchBlocked(conn *amqp.Connection, changed func(amqp.Blocking)) *Blocked {
	// Buffered, and drained until the library closes it with the connection.
	return FollowBlocked(conn.NotifyBlocked(make(chan amqp.Blocking, 4)), changed)
}

// FollowBlocked is WatchBlocked over the broker's notes as they come (a
// connection's NotifyBlocked channel), until notes is closed.
func FollowBlocked(notes <-chan amqp.Blocking, changed func(amqp.Blocking)) *Blocked {
	b := &Blocked{done: make(chan struct{})}
	go b.follow(notes, changed)
	return b
}

// follow is WatchBlocked's goroutine: it reads the broker's notes until the
// library closes the channel with the connection.
func (b *Blocked) follow(notes <-chan amqp.Blocking, changed func(amqp.Blocking)) {
	defer close(b.done)
	blocked := false
	for n := range notes {
		b.set(n.Active)
		blocked = n.Active
		if changed != nil {
			changed(n)
		}
	}
	b.set(false)
	if blocked && changed != nil {
		changed(amqp.Blocking{Active: false, Reason: "the connection closed"})
	}
}

func (b *Blocked) set(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case on && b.unblocked == nil:
		b.unblocked = make(chan struct{})
	case !on && b.unblocked != nil:
		close(b.unblocked)
		b.unblocked = nil
	}
}

// Done is closed when the watch has ended, after the connection closed.
func (b *Blocked) Done() <-chan struct{} { return b.done }

// Until is nil while the connection is not blocked, and else a channel
// closed when it is unblocked (or closes).
func (b *Blocked) Until() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unblocked
}

// WaitUnblocked returns at once unless the connection is blocked; then it
// waits until it is unblocked (or closes), or until ctx ends.
func (b *Blocked) WaitUnblocked(ctx context.Context) error {
	ch := b.Until()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Nodes remembers the broker node of the last session, to tell a failover:
// a session on another node than the one before it. For the goroutine that
// runs the sessions alone.
type Nodes struct{ last string }

// Connected records the node of a new session and returns the node of the
// one before if that was another (a failover), else "".
func (n *Nodes) Connected(node string) (from string) {
	if n.last != "" && node != n.last {
		from = n.last
	}
	n.last = node
	return from
}

// Last is the node of the last session, "" before the first.
func (n *Nodes) Last() string { return n.last }
