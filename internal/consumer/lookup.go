package consumer

import (
	"context"
	"sync"

	"github.com/inbox-template/payment-service/internal/inbox"
)

// lookupBatch bounds the ids read by one inbox look-up.
const lookupBatch = 128

// lookups runs the inbox look-ups of the workers: each of a few goroutines
// takes the look-ups waiting at that moment (without waiting for more) and
// reads them with one statement. Under load one read serves dozens of
// messages; alone, a look-up goes at once.
type lookups struct {
	inbox *inbox.Inbox
	jobs  chan *lookupJob
}

type lookupJob struct {
	key  inbox.Key
	seen inbox.Seen
	err  error
	done chan struct{}
}

// seen looks one message up; it fails only if the read fails or ctx ends.
func (l *lookups) seen(ctx context.Context, id string, body []byte) (bool, error) {
	j := &lookupJob{key: inbox.Key{MessageID: id, Body: body}, done: make(chan struct{})}
	select {
	case l.jobs <- j:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	select {
	case <-j.done:
		if j.err != nil {
			return false, j.err
		}
		return j.seen.Applied, j.seen.Err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// run starts n readers; they stop when ctx ends. The caller waits on wg.
func (l *lookups) run(ctx context.Context, n int, wg *sync.WaitGroup) {
	for range n {
		wg.Go(func() {
			for {
				select {
				case j := <-l.jobs:
					l.read(ctx, l.gather(j))
				case <-ctx.Done():
					return
				}
			}
		})
	}
}

func (l *lookups) gather(first *lookupJob) []*lookupJob {
	batch := []*lookupJob{first}
	for len(batch) < lookupBatch {
		select {
		case j := <-l.jobs:
			batch = append(batch, j)
		default:
			return batch
		}
	}
	return batch
}

func (l *lookups) read(ctx context.Context, batch []*lookupJob) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyMargin)
	defer cancel()
	keys := make([]inbox.Key, len(batch))
	for i, j := range batch {
		keys[i] = j.key
	}
	seen, err := l.inbox.SeenMany(ctx, keys)
	for i, j := range batch {
		if err != nil {
			j.err = err
		} else {
			j.seen = seen[i]
		}
		close(j.done)
	}
}
