package consumer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/wire"
)

// The consumer suite runs a test against each inbox mode, gated by what the
// mode promises, instead of a hand-made copy per mode.

// modeCase is one inbox mode as the suite runs it.
type modeCase struct {
	name string
	// orderPerKey: the events of one ordering key are applied in the order
	// they were published.
	orderPerKey bool
	// acksAtIngest: a delivery is acked once it is stored, before its
	// handler runs (a poison message is parked, not dead-lettered).
	acksAtIngest bool
}

var modeCases = []modeCase{
	{name: "inline"},
	{name: "buffered", orderPerKey: true, acksAtIngest: true},
}

// eachMode runs f as a subtest per mode.
func eachMode(t *testing.T, f func(t *testing.T, m modeCase)) {
	for _, m := range modeCases {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

func (m modeCase) buffered() bool { return m.acksAtIngest }

// newEnv is the suite's env: the buffered tables and the ordered events'
// table exist in either mode.
func (m modeCase) newEnv(t *testing.T) *env { return newBufferedEnv(t, nil) }

// config switches a runtime whose inbox is db to the mode; more tunes the
// buffered mode's settings.
func (m modeCase) config(db *gorm.DB, dbURL string, more func(*BufferedConfig)) func(*Config) {
	if !m.buffered() {
		return func(*Config) {}
	}
	return withBuffered(db, dbURL, more)
}

// taken is how many deliveries the runtime has taken off the queue for
// good: applied (inline), stored (buffered).
func (m modeCase) taken(e *env, rt *runtime) int {
	if m.buffered() {
		return rt.count(OutcomeStored)
	}
	_, distinct := e.applied()
	return distinct
}

// assertEventsApplied checks that each key's events 0…n-1 were applied once
// each, and in order where the mode promises it, and that nothing was
// dead-lettered or parked.
func (m modeCase) assertEventsApplied(e *env, keys []string, n int) {
	e.t.Helper()
	if m.orderPerKey {
		e.assertInOrder(keys, n)
	} else {
		want := make([]int, n)
		for i := range want {
			want[i] = i
		}
		for _, k := range keys {
			got := e.appliedOf(k)
			slices.Sort(got)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				e.t.Errorf("key %s applied %v, want each of 0…%d once", k, got, n-1)
			}
		}
	}
	if d := e.queueDepth(e.topo.DeadLetterQueue); d != 0 {
		e.t.Errorf("%d messages dead-lettered", d)
	}
	if p := e.statusCount(buffered.StatusParked); p != 0 {
		e.t.Errorf("%d messages parked", p)
	}
}

// settledForGood is a message the runtime gave up on: dead-lettered
// (inline), parked (buffered).
type settledForGood struct {
	id, reason, err, body string
	attempts              int // the runs the message had, the last included
}

// givenUp waits for n messages given up on and returns them: the dead
// letters of the inline mode, the parked rows of the buffered one.
func (m modeCase) givenUp(e *env, n int) []settledForGood {
	e.t.Helper()
	var out []settledForGood
	if !m.acksAtIngest {
		for _, d := range e.deadLetters(n) {
			a, _ := intHeader(d.Headers, wire.HeaderAttempt)
			out = append(out, settledForGood{id: d.MessageId, reason: fmt.Sprint(d.Headers[wire.HeaderDeadLetterReason]),
				err: fmt.Sprint(d.Headers[wire.HeaderDeadLetterError]), body: string(d.Body), attempts: a})
		}
		slices.SortFunc(out, func(a, b settledForGood) int { return strings.Compare(a.id, b.id) })
		return out
	}
	testenv.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d messages parked", n), func() (bool, error) {
		return e.statusCount(buffered.StatusParked) >= n, nil
	})
	rows, err := e.db.Raw(`SELECT message_id, coalesce(park_reason, ''), coalesce(last_error, ''), convert_from(body, 'UTF8'), attempts
		FROM inbox_messages WHERE status = ? ORDER BY message_id`, string(buffered.StatusParked)).Rows()
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var g settledForGood
		if err := rows.Scan(&g.id, &g.reason, &g.err, &g.body, &g.attempts); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// budget sets the retry budget of the mode: the runs of one message, the
// first included (the processing's in the buffered mode, whose retries cost
// the broker nothing).
func (m modeCase) budget(e *env, attempts int, more func(*Config)) func(*Config) {
	return func(c *Config) {
		m.config(e.db, e.dbURL, func(b *BufferedConfig) { b.MaxAttempts = attempts })(c)
		c.MaxAttempts = attempts
		if more != nil {
			more(c)
		}
	}
}
