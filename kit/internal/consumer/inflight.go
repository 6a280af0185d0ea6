package consumer

import (
	"context"
	"sync"
)

// inFlight makes the workers of one replica take a message id one at a time.
// A producer's duplicate often arrives right behind the original; without
// this, both would pass the inbox look-up together and both call out (the
// second getting a 409 from an idempotent gateway, then a retry). Waiting for
// the first lets the look-up find its committed row instead. Replicas do not
// share this: across them the idempotency key and the inbox key decide.
type inFlight struct {
	mu  sync.Mutex
	ids map[string]chan struct{}
}

// acquire waits until no other worker holds id, then holds it until release
// is called. It fails only if ctx ends first.
func (f *inFlight) acquire(ctx context.Context, id string) (release func(), err error) {
	for {
		f.mu.Lock()
		busy, ok := f.ids[id]
		if !ok {
			done := make(chan struct{})
			f.ids[id] = done
			f.mu.Unlock()
			return func() {
				f.mu.Lock()
				delete(f.ids, id)
				f.mu.Unlock()
				close(done)
			}, nil
		}
		f.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
