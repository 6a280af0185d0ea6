package consumer

import (
	"context"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
)

// lookupBatch bounds the ids read by one inbox look-up.
const lookupBatch = 128

// lookups runs the inbox look-ups of the workers: each of a few readers takes
// the look-ups waiting at that moment (without waiting for more) and reads
// them with one statement. Under load one read serves dozens of messages;
// alone, a look-up goes at once.
type lookups struct {
	*batcher[*lookupJob]
	inbox *inbox.Inbox
}

func newLookups(ib *inbox.Inbox) *lookups {
	l := &lookups{inbox: ib}
	l.batcher = newBatcher(lookupBatch, 0, l.read)
	return l
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
	if err := l.submit(ctx, j, j.done); err != nil {
		return false, err
	}
	if j.err != nil {
		return false, j.err
	}
	return j.seen.Applied, j.seen.Err
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
