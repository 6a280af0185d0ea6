package retention

import (
	"context"
	"time"
)

// Run prunes once at start and then every Interval until ctx is done. Every
// replica runs it; the advisory lock lets one of them prune at a time. A failed
// run is logged and tried again at the next interval. With Interval 0, Run
// returns at once.
func (p *Pruner) Run(ctx context.Context) {
	if p.cfg.Interval <= 0 {
		p.log.Info("scheduled inbox pruning disabled")
		return
	}
	// At start too: a service redeployed more often than Interval would
	// otherwise never prune.
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.runOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Pruner) runOnce(ctx context.Context) {
	res, err := p.Prune(ctx)
	switch {
	case ctx.Err() != nil:
		// Shutting down: the batch in flight rolled back; nothing is lost.
	case err != nil:
		p.log.Error("inbox prune failed; retrying at the next interval", "deleted", res.Deleted, "err", err)
	case res.Skipped:
		p.log.Debug("inbox prune skipped: another replica holds the lock")
	default:
		p.log.Info("inbox pruned", "deleted", res.Deleted, "batches", res.Batches,
			"deleted_buffered_messages", res.DeletedMessages, "deleted_keys", res.DeletedKeys,
			"cutoff", res.Cutoff.UTC().Format(time.RFC3339), "elapsed", res.Elapsed.String(),
			"longest_batch", res.LongestBatch.String())
	}
}
