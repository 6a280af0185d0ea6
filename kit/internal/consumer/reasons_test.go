package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/wire"
)

// A reason or a cause becomes a metric label and a header: one made from an
// error's text would be a label per failure. They are values made once, at
// start, by NewReason and NewCause, which refuse a word not of the form of
// one by panicking (a package-level var: the program stops as it starts,
// naming the word), so a handler cannot dead-letter with a malformed reason
// at run time. (That a string does not convert to a Reason is the compiler's.)
func TestReasonsAndCausesAreWordsRefusedAtStart(t *testing.T) {
	t.Parallel()
	if err := Pause(NewCause("gateway_down"), nil); err.Error() != "gateway_down" {
		t.Errorf("Pause with no error: %q", err)
	}
	if err := Permanent(Reason{}, nil); err.Error() != wire.ReasonPermanent || Permanent(reasonKeyExpired, nil).Error() != wire.ReasonKeyExpired || permanentReason(err) != reasonPermanent {
		t.Errorf("Permanent with neither a reason nor an error: %q, dead-lettered as %s", err, permanentReason(err))
	}
	refused := func(make func()) (msg string) {
		defer func() {
			if we, ok := recover().(*wordError); ok {
				msg = we.Error()
			}
		}()
		make()
		return ""
	}
	for _, c := range []struct {
		word  string
		valid bool
	}{
		{"invalid_amount", true}, {"gateway_rejected2", true}, {strings.Repeat("a", 64), true},
		{"", false}, {"Card declined", false}, {"card declined: 402", false}, {"2fa_failed", false},
		{"order-conflict", false}, {strings.Repeat("a", 65), false}, {"naïve", false},
	} {
		var reason Reason
		msg := refused(func() { reason = NewReason(c.word) })
		switch {
		case c.valid && msg != "":
			t.Errorf("NewReason(%q) refused: %s", c.word, msg)
		case c.valid && (reason.String() != c.word || permanentReason(Permanent(reason, errors.New("x"))) != reason):
			t.Errorf("NewReason(%q) = %q, dead-lettered as %s", c.word, reason, permanentReason(Permanent(reason, errors.New("x"))))
		case !c.valid && !strings.Contains(msg, fmt.Sprintf("%q", c.word)):
			t.Errorf("NewReason(%q) panicked with %q, want a message naming the word", c.word, msg)
		}
		var cause Cause
		msg = refused(func() { cause = NewCause(c.word) })
		var pause *PauseError
		switch {
		case c.valid && msg != "":
			t.Errorf("NewCause(%q) refused: %s", c.word, msg)
		case c.valid && (!errors.As(Pause(cause, errors.New("down")), &pause) || pauseCause(pause) != cause || cause.String() != c.word):
			t.Errorf("NewCause(%q) = %q, paused as %s", c.word, cause, pauseCause(pause))
		case !c.valid && !strings.Contains(msg, fmt.Sprintf("%q", c.word)):
			t.Errorf("NewCause(%q) panicked with %q, want a message naming the word", c.word, msg)
		}
	}
	// A pause without a cause is the service's code's all the same: it
	// pauses as invalid_cause (and counts against MaxHolds), not as the
	// runtime's handler_failing, and its text names that.
	for _, err := range []error{&PauseError{}, Pause(Cause{}, errors.New("down"))} {
		if got := pauseCause(err); got != causeInvalid || !askedToPause(err) || !strings.HasPrefix(err.Error(), "invalid_cause") {
			t.Errorf("%#v: paused as %q (asked: %v), text %q; want invalid_cause, asked, named", err, got, askedToPause(err), err)
		}
	}
	// Made at run time by the handler, its writes or the Decoder, a
	// malformed word dead-letters the message at once with invalid_reason,
	// the word in the error: no retry mends it.
	recovered := Recover(func(Message, any, []byte) {})
	badReason := recovered(HandlerFunc(func(_ context.Context, msg Message) (Writes, error) {
		return nil, Permanent(NewReason("Bad "+msg.ID), nil)
	}))
	badCause := recovered(HandlerFunc(func(_ context.Context, msg Message) (Writes, error) {
		return func(context.Context, *gorm.DB) (Outcome, error) { return "", Pause(NewCause("down: "+msg.ID), nil) }, nil
	}))
	_, err := badReason.Handle(context.Background(), Message{ID: "m-1"})
	w, _ := badCause.Handle(context.Background(), Message{ID: "m-2"})
	_, werr := w(context.Background(), nil)
	for _, c := range []struct {
		err  error
		word string
	}{{err, `"Bad m-1"`}, {werr, `"down: m-2"`}} {
		if permanentReason(c.err) != reasonInvalidReason || !errors.Is(c.err, ErrPermanent) || !strings.Contains(c.err.Error(), c.word) {
			t.Errorf("a malformed word made at run time: %v, dead-lettered as %s; want invalid_reason naming %s", c.err, permanentReason(c.err), c.word)
		}
	}
	d := assemble(&Runtime{cfg: Config{Name: "t", Decoder: Events[string]{Decode: func(b []byte) (string, error) {
		return "", Permanent(NewReason(string(b)), nil)
	}}}, metrics: NewMetrics(prometheus.NewRegistry()), log: slog.New(slog.DiscardHandler)}).door
	if _, err := d.decode(origin{}, []byte("Not A Word"), "m-3"); permanentReason(err) != reasonInvalidReason {
		t.Errorf("a Decoder's malformed reason: %v, dead-lettered as %s; want invalid_reason", err, permanentReason(err))
	}
	// A log's JSON shows the word, not an empty object.
	if b, err := json.Marshal(map[string]any{"reason": reasonKeyExpired, "cause": CauseDatabase}); err != nil ||
		string(b) != `{"cause":"database","reason":"idempotency_key_expired"}` {
		t.Errorf("as JSON: %s (%v)", b, err)
	}
}

// Writes that return neither an outcome nor an error used to count as
// processed, silently; now nothing of them commits and the message is
// dead-lettered (inline) or parked (buffered) with writes_without_outcome.
func TestWritesWithoutAnOutcomeAreRefused(t *testing.T) {
	t.Parallel()
	noOutcome := HandlerFunc(func(_ context.Context, msg Message) (Writes, error) {
		return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
			return "", tx.Exec(`INSERT INTO effects (message_id, body) VALUES (?, ?)`, msg.ID, string(msg.Body)).Error
		}, nil
	})
	t.Run("inline", func(t *testing.T) {
		e := newEnv(t)
		rt := e.start(noOutcome, nil)
		e.publish("m-1", "{}")
		d := e.deadLetters(1)[0]
		if d.MessageId != "m-1" || d.Headers[wire.HeaderDeadLetterReason] != string(wire.ReasonNoOutcome) {
			t.Errorf("dead letter %s with reason %v, want m-1 with %s", d.MessageId, d.Headers[wire.HeaderDeadLetterReason], wire.ReasonNoOutcome)
		}
		if n := e.effects("m-1"); n != 0 || rt.count(OutcomeProcessed) != 0 {
			t.Errorf("%d effects committed, %d processed; want none", n, rt.count(OutcomeProcessed))
		}
	})
	t.Run("buffered", func(t *testing.T) {
		e := newBufferedEnv(t, nil)
		rt := e.start(noOutcome, withBuffered(e.db, e.dbURL, nil))
		e.publish("m-1", `{"key":"k","n":1}`)
		waitFor(t, "the message parked", func() bool { return e.statusCount(buffered.StatusParked) == 1 })
		var reason string
		if err := e.db.Raw(`SELECT park_reason FROM inbox_messages WHERE message_id = 'm-1'`).Scan(&reason).Error; err != nil || reason != string(wire.ReasonNoOutcome) {
			t.Errorf("park reason %q (%v), want %s", reason, err, wire.ReasonNoOutcome)
		}
		if n := e.effects("m-1"); n != 0 || rt.count(OutcomeProcessed) != 0 {
			t.Errorf("%d effects committed, %d processed; want none", n, rt.count(OutcomeProcessed))
		}
	})
}

// From an outside review: a handler that writes through its read-only Reader
// gets 25006, the SQLSTATE of a standby after a failover; from the runtime's
// own step that is the database's fault, from the handler's it is the
// message's unless the database fails its check. It used to pause
// consumption with cause database, put the message back, resume (the check
// passed) and fail again, forever; now the message spends its attempts.
func TestHandlersDatabaseErrorIsConfirmedByTheCheck(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, m modeCase) {
		e := m.newEnv(t)
		reader := database.NewReader(e.db)
		h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
			return nil, reader.Read(ctx, func(tx *gorm.DB) error {
				return tx.Exec(`INSERT INTO effects (message_id, body) VALUES (?, ?)`, msg.ID, "x").Error
			})
		})
		rt := e.start(h, m.config(e.db, e.dbURL, nil))
		e.publish("m-1", `{"key":"k","n":1}`)
		if m.acksAtIngest {
			waitFor(t, "the message parked", func() bool { return e.statusCount(buffered.StatusParked) == 1 })
		} else {
			waitFor(t, "the message dead-lettered", func() bool { return rt.count(OutcomeDeadLettered) == 1 })
		}
		if rt.pauses() != 0 {
			t.Errorf("%d pauses: the handler's own 25006 was taken for a database outage", rt.pauses())
		}
	})
}
