package consumer

import (
	"context"
	"errors"
	"runtime/debug"
	"time"

	"gorm.io/gorm"
)

// Recover turns a handler panic into an error, so one bad message cannot crash
// the service; the message is retried and the panic counted. The writes a
// handler returns are covered too: they run later, in the committer.
func Recover(onPanic func(msg Message, v any, stack []byte)) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, msg Message) (w Writes, err error) {
			defer func() {
				if v := recover(); v != nil {
					onPanic(msg, v, debug.Stack())
					w, err = nil, panicError(v)
				}
			}()
			w, err = next.Handle(ctx, msg)
			switch {
			case w == nil && err == nil:
				return nil, errNoWrites
			case w == nil:
				return w, err
			}
			return recoverWrites(msg, w, onPanic), err
		})
	}
}

// recoverWrites contains a panic of the writes, and refuses writes that
// return neither an outcome nor an error: an empty outcome used to count as
// processed, silently; now the message is dead-lettered (parked) with
// ReasonNoOutcome, nothing of its writes committed, and the log says which.
func recoverWrites(msg Message, w Writes, onPanic func(msg Message, v any, stack []byte)) Writes {
	return func(ctx context.Context, tx *gorm.DB) (out Outcome, err error) {
		defer func() {
			if v := recover(); v != nil {
				onPanic(msg, v, debug.Stack())
				out, err = "", panicError(v)
			}
		}()
		out, err = w(ctx, tx)
		if err == nil && out == "" {
			return "", errNoOutcome
		}
		return out, err
	}
}

// errNoOutcome is the error of writes that returned no outcome and no error,
// errNoWrites that of a Handle that returned no writes and no error.
var (
	errNoOutcome = Permanent(reasonNoOutcome, errors.New("the writes returned no outcome and no error: "+
		"return kit.OutcomeProcessed, kit.OutcomeDuplicate or an outcome of the service's own"))
	errNoWrites = Permanent(reasonNoOutcome, errors.New("the handler returned no writes and no error: "+
		"return kit.NoWrites(outcome) for a message with nothing to write"))
)

// Timeout bounds one handler call, outside calls included. Keep it well below
// RabbitMQ's consumer acknowledgement timeout, or the broker closes the channel
// under a slow handler. The writes are bounded by the commit, not by this.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return next.Handle(ctx, msg)
		})
	}
}

// Observe records the handler's latency: the outside-call step, with no
// transaction open.
func Observe(m *Metrics, consumer string) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
			start := time.Now()
			w, err := next.Handle(ctx, msg)
			m.handlerSeconds.WithLabelValues(consumer).Observe(time.Since(start).Seconds())
			return w, err
		})
	}
}
