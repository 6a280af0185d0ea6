package consumer

import (
	"sync"
	"sync/atomic"
)

// failureStreak is the run of handler failures with no success between them,
// counted in distinct messages: one message failing again and again is that
// message's trouble, and its own budget ends it; many messages failing in a
// row is a dependency down for all of them (PauseAfterFailures), and then,
// until a success, no budget ends a message.
type failureStreak struct {
	mu  sync.Mutex
	ids map[string]struct{}
	// n mirrors len(ids), so that a success (every message's path) costs an
	// atomic load while there is no run to end.
	n atomic.Int64
}

// fail adds a failed message and reports how many distinct messages the run
// holds now. It stops growing at limit: no more is needed to decide.
func (s *failureStreak) fail(id string, limit int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[string]struct{}{}
	}
	if len(s.ids) < limit {
		s.ids[id] = struct{}{}
	}
	s.n.Store(int64(len(s.ids)))
	return len(s.ids)
}

// succeeded ends the run.
func (s *failureStreak) succeeded() {
	if s.n.Load() == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.ids)
	s.n.Store(0)
}

// len is the number of distinct messages in the run.
func (s *failureStreak) len() int { return int(s.n.Load()) }
