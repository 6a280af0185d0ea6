package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/buffered"
)

// finisher commits the handlers' writes of the buffered mode together with
// the status of their messages: like the committer of the inline mode, a
// fixed number of goroutines (Config.Committers) each commit a batch of up to
// GroupCommitMax messages in one transaction.
type finisher struct {
	store   *buffered.Store
	max     int
	wait    time.Duration
	timeout time.Duration
	jobs    chan *finishJob
	metrics *Metrics
	name    string
}

type finishJob struct {
	lease  buffered.Lease
	writes Writes
	res    buffered.Completed
	done   chan struct{}
}

// complete hands a message's writes to the finishers and waits for the
// transaction that holds them. If ctx ends first the message is given up: its
// writes may still commit, or its lease expires and it runs again.
func (f *finisher) complete(ctx context.Context, l buffered.Lease, w Writes) (buffered.Completed, error) {
	j := &finishJob{lease: l, writes: w, done: make(chan struct{})}
	select {
	case f.jobs <- j:
	case <-ctx.Done():
		return buffered.Completed{}, ctx.Err()
	}
	select {
	case <-j.done:
		return j.res, nil
	case <-ctx.Done():
		return buffered.Completed{}, ctx.Err()
	}
}

// run starts n finishers; they stop when ctx ends. The caller waits on wg.
func (f *finisher) run(ctx context.Context, n int, wg *sync.WaitGroup) {
	for range n {
		wg.Go(func() {
			for {
				select {
				case j := <-f.jobs:
					f.commitBatch(ctx, f.gather(ctx, j))
				case <-ctx.Done():
					return
				}
			}
		})
	}
}

func (f *finisher) gather(ctx context.Context, first *finishJob) []*finishJob {
	batch := []*finishJob{first}
	for len(batch) < f.max {
		select {
		case j := <-f.jobs:
			batch = append(batch, j)
			continue
		default:
		}
		break
	}
	if len(batch) == f.max || f.wait == 0 {
		return batch
	}
	timer := time.NewTimer(f.wait)
	defer timer.Stop()
	for len(batch) < f.max {
		select {
		case j := <-f.jobs:
			batch = append(batch, j)
		case <-timer.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

func (f *finisher) commitBatch(ctx context.Context, batch []*finishJob) {
	// Detached from shutdown: a batch that has begun commits or fails on its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	items := make([]buffered.Completion, len(batch))
	for i, j := range batch {
		items[i] = buffered.Completion{Lease: j.lease, Apply: applyWrites(ctx, j.writes)}
	}
	f.metrics.batchSize.WithLabelValues(f.name).Observe(float64(len(batch)))
	results, err := f.store.Complete(ctx, items, nil)
	for i, j := range batch {
		if err != nil {
			j.res = buffered.Completed{Err: fmt.Errorf("commit: %w", err)}
		} else {
			j.res = results[i]
		}
		close(j.done)
	}
}

func applyWrites(ctx context.Context, w Writes) func(tx *gorm.DB) (string, error) {
	return func(tx *gorm.DB) (string, error) {
		if w == nil {
			return string(OutcomeProcessed), nil
		}
		out, err := w(ctx, tx)
		return string(out), err
	}
}
