package consumer

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// finisher commits the handlers' writes of the buffered mode together with
// the status of their messages: like the committer of the inline mode, a
// fixed number of goroutines (Config.Committers) each commit a batch of up to
// GroupCommitMax messages in one transaction.
type finisher struct {
	*batcher[*finishJob]
	store   *buffered.Store
	timeout time.Duration // bounds one batch's transaction
	metrics *Metrics
	name    string
}

func newFinisher(store *buffered.Store, max int, wait, timeout time.Duration, m *Metrics, name string) *finisher {
	f := &finisher{store: store, timeout: timeout, metrics: m, name: name}
	f.batcher = newBatcher(max, wait, f.commitBatch)
	return f
}

type finishJob struct {
	lease  buffered.Lease
	writes Writes
	hooks  commitHooks  // OnCommit of the writes' last run
	span   tracing.Span // the processing's: the writes run under it
	res    buffered.Completed
	done   chan struct{}
}

// complete hands a message's writes to the finishers and waits for the
// transaction that holds them. If ctx ends first the message is given up: its
// writes may still commit, or its lease expires and it runs again.
func (f *finisher) complete(ctx context.Context, l buffered.Lease, w Writes) (buffered.Completed, error) {
	j := &finishJob{lease: l, writes: w, span: tracing.FromContext(ctx), done: make(chan struct{})}
	if err := f.submit(ctx, j, j.done); err != nil {
		return buffered.Completed{}, err
	}
	return j.res, nil
}

func (f *finisher) commitBatch(ctx context.Context, batch []*finishJob) {
	// Detached from shutdown: a batch that has begun commits or fails on its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	items := make([]buffered.Completion, len(batch))
	for i, j := range batch {
		items[i] = buffered.Completion{Lease: j.lease, Apply: applyWrites(ctx, j)}
	}
	f.metrics.batchSize.WithLabelValues(f.name).Observe(float64(len(batch)))
	start := time.Now()
	results, err := f.store.Complete(ctx, items, nil)
	f.metrics.commitSeconds.WithLabelValues(f.name).Observe(time.Since(start).Seconds())
	for i, j := range batch {
		switch {
		case err != nil:
			j.res = buffered.Completed{Err: fmt.Errorf("commit: %w", err)}
		default:
			j.res = results[i]
			if j.res.Err == nil && !j.res.Lost {
				j.hooks.committed()
			}
		}
		close(j.done)
	}
}

func applyWrites(ctx context.Context, j *finishJob) func(tx *gorm.DB) (string, error) {
	return func(tx *gorm.DB) (string, error) {
		if j.writes == nil {
			return string(OutcomeProcessed), nil
		}
		// An outbox row the writes add carries the processing's trace on.
		out, err := j.writes(tracing.ContextWith(j.hooks.run(ctx), j.span), tx)
		return string(out), err
	}
}
