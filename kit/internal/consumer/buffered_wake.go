package consumer

import (
	"context"
	"time"

	"github.com/inbox-template/payment-service/kit/database"
)

// notifyEvery throttles the NOTIFY that tells the other replicas this one
// stored messages: at most one per interval, and one after a burst ends.
const notifyEvery = 50 * time.Millisecond

// notifyChannel is the LISTEN/NOTIFY channel of a consumer's buffered inbox.
func notifyChannel(consumer string) string { return database.Channel("inbox_buffered", consumer) }

// notifyOthers sends a NOTIFY on the consumer's channel after this replica
// stored messages, throttled to one per notifyEvery.
func (p *processor) notifyOthers(ctx context.Context) {
	channel := notifyChannel(p.rt.cfg.Name)
	database.NotifyThrottled(ctx, p.notify, notifyEvery, func(ctx context.Context) error {
		return p.cfg.Store.Notify(ctx, channel)
	}, p.log)
}

// listen wakes the claimer on every NOTIFY of the other replicas.
func (p *processor) listen(ctx context.Context) {
	if p.cfg.ListenURL == "" {
		return
	}
	database.Listen(ctx, p.cfg.ListenURL, p.rt.cfg.Name+" listen", notifyChannel(p.rt.cfg.Name), func() { poke(p.wake) }, p.log)
}
