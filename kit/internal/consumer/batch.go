package consumer

import (
	"context"
	"sync"
	"time"
)

// batcher hands the jobs of many workers to a few goroutines that serve them in
// batches: each takes a job, then the jobs already waiting, then those arriving
// within wait, up to max, and serves them together. Committers and inbox
// look-ups are batchers: a bounded number of database connections serves any
// number of workers, one statement or transaction for many messages.
type batcher[J any] struct {
	jobs  chan J
	max   int
	wait  time.Duration
	serve func(ctx context.Context, batch []J)
}

func newBatcher[J any](max int, wait time.Duration, serve func(ctx context.Context, batch []J)) *batcher[J] {
	return &batcher[J]{jobs: make(chan J), max: max, wait: wait, serve: serve}
}

// submit hands j over and waits until done is closed; it gives up if ctx ends
// first (the job may still be served).
func (b *batcher[J]) submit(ctx context.Context, j J, done <-chan struct{}) error {
	select {
	case b.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run starts n servers; they stop when ctx ends. The caller waits on wg.
func (b *batcher[J]) run(ctx context.Context, n int, wg *sync.WaitGroup) {
	for range n {
		wg.Go(func() {
			for {
				select {
				case j := <-b.jobs:
					b.serve(ctx, b.gather(ctx, j))
				case <-ctx.Done():
					return
				}
			}
		})
	}
}

// gather collects a batch: first what is already waiting, then what arrives
// within the wait, up to the maximum.
func (b *batcher[J]) gather(ctx context.Context, first J) []J {
	batch := []J{first}
	for len(batch) < b.max {
		select {
		case j := <-b.jobs:
			batch = append(batch, j)
			continue
		default:
		}
		break
	}
	if len(batch) == b.max || b.wait == 0 {
		return batch
	}
	timer := time.NewTimer(b.wait)
	defer timer.Stop()
	for len(batch) < b.max {
		select {
		case j := <-b.jobs:
			batch = append(batch, j)
		case <-timer.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}
