package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/buffered"
	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/wire"
)

// A reason or a cause becomes a metric label and a header: one made from an
// error's text would be a label per failure. Permanent and Pause keep those
// of the form of a word and replace the others, keeping the text given.
func TestReasonsAndCausesAreWords(t *testing.T) {
	t.Parallel()
	if err := Pause("gateway_down", nil); err.Error() != "gateway_down" {
		t.Errorf("Pause with no error: %q", err)
	}
	for _, c := range []struct {
		reason Reason
		valid  bool
	}{
		{"invalid_amount", true}, {"gateway_rejected2", true}, {Reason(strings.Repeat("a", 64)), true},
		{"", false}, {"Card declined", false}, {"card declined: 402", false}, {"2fa_failed", false},
		{"order-conflict", false}, {Reason(strings.Repeat("a", 65)), false}, {"naïve", false},
	} {
		err := Permanent(c.reason, errors.New("the cause"))
		var pe *PermanentError
		if !errors.As(err, &pe) {
			t.Fatalf("%q: %T", c.reason, err)
		}
		switch {
		case c.valid && pe.Reason != c.reason:
			t.Errorf("%q: reason %q, want it kept", c.reason, pe.Reason)
		case !c.valid && (pe.Reason != wire.ReasonInvalidReason || !strings.Contains(err.Error(), string(c.reason)) ||
			!strings.Contains(err.Error(), "the cause")):
			t.Errorf("%q: reason %q, error %q; want %s keeping the reason and the cause in the text", c.reason, pe.Reason, err, wire.ReasonInvalidReason)
		}
		var pause *PauseError
		if errors.As(Pause(Cause(c.reason), errors.New("down")), &pause); (pause.Cause == Cause(c.reason)) != c.valid ||
			(!c.valid && pause.Cause != CauseInvalid) {
			t.Errorf("Pause(%q): cause %q", c.reason, pause.Cause)
		}
		// Built by hand, without the constructors: checked where they are read.
		wantReason, wantCause := c.reason, Cause(c.reason)
		if !c.valid {
			wantReason, wantCause = wire.ReasonInvalidReason, CauseInvalid
		}
		if c.reason == "" {
			wantReason, wantCause = wire.ReasonPermanent, ""
		}
		if got := permanentReason(&PermanentError{Reason: c.reason}); got != wantReason {
			t.Errorf("PermanentError{Reason: %q}: dead-lettered as %q, want %q", c.reason, got, wantReason)
		}
		if got := pauseCause(&PauseError{Cause: Cause(c.reason)}); c.reason != "" && got != wantCause {
			t.Errorf("PauseError{Cause: %q}: paused as %q, want %q", c.reason, got, wantCause)
		}
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
