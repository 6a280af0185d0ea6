package consumer

import (
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// A failure only the buffered mode meets: its release of a claimed message.
// The broker's connections closed under load, the database unreachable and
// backends terminated mid-transaction run in both modes: faults_test.go
// (eachMode).

// PostgreSQL is unreachable when a claimed message's handler returns, for
// longer than its lease: its commit fails, and so does the release that
// would give its attempt back. The release is kept and done when the pause
// ends, before this replica claims again: the message succeeds on its next
// run with one attempt spent (and two runs: it may have called out).
func TestUnreachableDatabaseGivesTheAttemptBackAfterThePause(t *testing.T) {
	t.Parallel()
	e := newBufferedEnv(t, nil)
	proxy := testenv.Proxy(t, "postgres", "127.0.0.1:5432")
	dbURL := proxiedURL(t, e.dbURL, proxy.Listen)
	db := openPool(t, dbURL, 2*time.Second)
	inHandler := make(chan struct{}, 1)
	resume := make(chan struct{})
	first := true
	handler := orderedHandler(func(Message, event) error {
		if first {
			first = false
			inHandler <- struct{}{}
			<-resume
		}
		return nil
	})
	e.startWith(handler, e.url, db, func(c *Config) {
		withBuffered(db, dbURL, func(b *BufferedConfig) { b.Lease = 2 * time.Second })(c)
		c.Workers = 1
	})
	e.publishEvents([]string{"key-00"}, 1)
	<-inHandler
	proxy.Stop()
	close(resume) // the commit fails: the database is unreachable
	testenv.Eventually(t, time.Minute, "the message's lease run out during the outage", func() (bool, error) {
		var leased int
		err := e.db.Raw(`SELECT count(*) FROM inbox_messages WHERE status = 'processing' AND available_at > now()`).Row().Scan(&leased)
		return leased == 0, err
	})
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "applied", func() (bool, error) { return e.appliedTotal() >= 1, nil })
	var attempts, runs int
	if err := e.db.Raw(`SELECT attempts, runs FROM inbox_messages`).Row().Scan(&attempts, &runs); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || runs != 2 {
		t.Errorf("attempts %d, runs %d after one outage and one success, want 1 and 2: the outage spent an attempt", attempts, runs)
	}
}
