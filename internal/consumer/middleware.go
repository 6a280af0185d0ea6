package consumer

import (
	"context"
	"runtime/debug"
	"time"

	"gorm.io/gorm"
)

// Recover turns a handler panic into an error, so one bad message cannot crash
// the service; the message is retried and the panic counted.
func Recover(onPanic func(msg Message, v any, stack []byte)) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, tx *gorm.DB, msg Message) (out Outcome, err error) {
			defer func() {
				if v := recover(); v != nil {
					onPanic(msg, v, debug.Stack())
					out, err = "", panicError(v)
				}
			}()
			return next.Handle(ctx, tx, msg)
		})
	}
}

// Timeout bounds one handler call. Keep it well below RabbitMQ's consumer
// acknowledgement timeout, or the broker closes the channel under a slow handler.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, tx *gorm.DB, msg Message) (Outcome, error) {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return next.Handle(ctx, tx.WithContext(ctx), msg)
		})
	}
}

// Observe records the handler's latency.
func Observe(m *Metrics, consumer string) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, tx *gorm.DB, msg Message) (Outcome, error) {
			start := time.Now()
			out, err := next.Handle(ctx, tx, msg)
			m.handlerSeconds.WithLabelValues(consumer).Observe(time.Since(start).Seconds())
			return out, err
		})
	}
}
