package consumer

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// notifyEvery throttles the NOTIFY that tells the other replicas this one
// stored messages: at most one per interval, and one after a burst ends.
const notifyEvery = 50 * time.Millisecond

// notifyChannel is the LISTEN/NOTIFY channel of a consumer: an identifier of
// fixed length, whatever the consumer's name.
func notifyChannel(consumer string) string {
	h := fnv.New64a()
	h.Write([]byte(consumer))
	return fmt.Sprintf("inbox_buffered_%016x", h.Sum64())
}

// notifyOthers sends a NOTIFY on the consumer's channel after this replica
// stored messages, throttled to one per notifyEvery: a signal arriving while
// it waits is covered by the NOTIFY that follows the wait.
func (p *processor) notifyOthers(ctx context.Context) {
	channel := notifyChannel(p.rt.cfg.Name)
	var last time.Time
	for {
		select {
		case <-p.notify:
		case <-ctx.Done():
			return
		}
		if !sleep(ctx, notifyEvery-time.Since(last)) {
			return
		}
		select { // a signal of the wait is covered by this NOTIFY
		case <-p.notify:
		default:
		}
		last = time.Now()
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := p.cfg.Store.Notify(nctx, channel); err != nil && ctx.Err() == nil {
			p.log.Debug("NOTIFY failed; the other replicas poll", "err", err)
		}
		cancel()
	}
}

// listen keeps a dedicated connection that LISTENs on the consumer's channel
// and wakes the claimer on every NOTIFY. It reconnects after a failure; the
// poll covers the gap.
func (p *processor) listen(ctx context.Context) {
	if p.cfg.ListenURL == "" {
		return
	}
	b := newBackoff(time.Second, 30*time.Second)
	for {
		started := time.Now()
		err := p.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			b.reset()
		}
		wait := b.next()
		p.log.Warn("LISTEN connection lost; reconnecting (the poll covers meanwhile)", "err", err, "wait", wait.String())
		if !sleep(ctx, wait) {
			return
		}
	}
}

func (p *processor) listenOnce(ctx context.Context) error {
	cc, err := pgx.ParseConfig(p.cfg.ListenURL)
	if err != nil {
		return err
	}
	cc.RuntimeParams["application_name"] = p.rt.cfg.Name + " listen"
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{notifyChannel(p.rt.cfg.Name)}.Sanitize()); err != nil {
		return err
	}
	poke(p.wake) // what was stored while no connection listened
	for {
		// A dead connection shows when the server's keepalive or this wait
		// fails; the wait ends every minute to find out.
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			poke(p.wake)
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
