package database

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wake-ups between replicas through LISTEN/NOTIFY: the buffered inbox's
// processing and the outbox relay learn from them that another replica
// committed work, with their poll as the floor when a NOTIFY is lost.

// Channel is a LISTEN/NOTIFY channel name of fixed length for kind and name
// (a consumer, a producer), whatever their length.
func Channel(kind, name string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return fmt.Sprintf("%s_%016x", kind, h.Sum64())
}

// Listen keeps a dedicated connection to url LISTENing on channel and calls
// wake on every NOTIFY, and once after each (re)connect for what was sent
// while no connection listened. It reconnects after a failure with a growing
// backoff, and returns when ctx ends.
func Listen(ctx context.Context, url, appName, channel string, wake func(), log *slog.Logger) {
	wait := time.Second
	for {
		started := time.Now()
		err := listenOnce(ctx, url, appName, channel, wake)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			wait = time.Second
		}
		d := wait/2 + rand.N(wait/2+1)
		wait = min(2*wait, 30*time.Second)
		log.Warn("LISTEN connection lost; reconnecting (the poll covers meanwhile)", "channel", channel, "err", err, "wait", d.String())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func listenOnce(ctx context.Context, url, appName, channel string, wake func()) error {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	cc.RuntimeParams["application_name"] = appName
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	wake()
	for {
		// A dead connection shows when the server's keepalive or this wait
		// fails; the wait ends every minute to find out.
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			wake()
		case ctx.Err() != nil:
			return nil
		case wctx.Err() != nil:
			if err := conn.Ping(ctx); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// NotifyThrottled sends a NOTIFY with send for each signal, at most one per
// every: a signal arriving while it waits is covered by the NOTIFY that
// follows the wait. It returns when ctx ends.
func NotifyThrottled(ctx context.Context, signals <-chan struct{}, every time.Duration, send func(context.Context) error, log *slog.Logger) {
	var last time.Time
	for {
		select {
		case <-signals:
		case <-ctx.Done():
			return
		}
		if d := every - time.Since(last); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		select { // a signal of the wait is covered by this NOTIFY
		case <-signals:
		default:
		}
		last = time.Now()
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := send(nctx); err != nil && ctx.Err() == nil {
			log.Debug("NOTIFY failed; the other replicas poll", "err", err)
		}
		cancel()
	}
}
