package fakegateway

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// MemoryStore keeps charges in memory, for benchmarks: a charge costs no
// database commit, nothing survives a restart, and inboxctl verify cannot see
// the charges. Its semantics are PostgresStore's; the same contract tests run
// against both.
type MemoryStore struct {
	mu    sync.Mutex
	byKey map[string]*memoryCharge // the charge holding each key
	byID  map[string]*memoryCharge // every charge, forgotten keys' included
}

// memoryCharge is one key's charge, as a row of the table charges would hold it.
type memoryCharge struct {
	id, key     string
	fingerprint []byte
	state       string
	status      string
	reason      string // decline reason
	code        int
	body        []byte
	replays     int
	createdAt   time.Time
	completedAt time.Time
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{byKey: map[string]*memoryCharge{}, byID: map[string]*memoryCharge{}}
}

func (s *MemoryStore) claim(_ context.Context, id, key string, fp []byte, _ chargeRequest) (claim, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, taken := s.byKey[key]; taken {
		return claim{id: id}, false, nil
	}
	ch := &memoryCharge{id: id, key: key, fingerprint: fp, state: stateInFlight, createdAt: time.Now()}
	s.byKey[key] = ch
	s.byID[id] = ch
	return claim{id: id, at: ch.createdAt}, true, nil
}

func (s *MemoryStore) lookup(_ context.Context, key string, takeover, keyTTL time.Duration) (existing, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byKey[key]
	if !ok {
		return existing{}, errKeyReleased
	}
	now := time.Now()
	return existing{
		id:          ch.id,
		fingerprint: ch.fingerprint,
		state:       ch.state,
		createdAt:   ch.createdAt,
		stale:       ch.state == stateInFlight && ch.createdAt.Before(now.Add(-takeover)),
		expired:     ch.state == stateCompleted && keyTTL > 0 && ch.completedAt.Before(now.Add(-keyTTL)),
	}, nil
}

func (s *MemoryStore) forget(_ context.Context, e existing) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byID[e.id]
	if !ok || s.byKey[ch.key] != ch {
		return false, nil
	}
	delete(s.byKey, ch.key)
	return true, nil
}

func (s *MemoryStore) takeOver(_ context.Context, e existing) (claim, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byID[e.id]
	if !ok || ch.state != stateInFlight || !ch.createdAt.Equal(e.createdAt) {
		return claim{id: e.id}, false, nil
	}
	// Strictly later than the snapshot, as now() in a later transaction is.
	ch.createdAt = later(time.Now(), e.createdAt)
	return claim{id: e.id, at: ch.createdAt}, true, nil
}

func (s *MemoryStore) complete(_ context.Context, resp chargeResponse, code int, body []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byID[resp.ID]
	if !ok || ch.state != stateInFlight {
		return false, nil
	}
	ch.state, ch.status, ch.reason = stateCompleted, resp.Status, resp.DeclineReason
	ch.code, ch.body, ch.completedAt = code, body, time.Now()
	return true, nil
}

func (s *MemoryStore) replay(_ context.Context, key string) (int, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byKey[key]
	if !ok || ch.state != stateCompleted {
		return 0, nil, fmt.Errorf("replay key %s: not completed", key)
	}
	ch.replays++
	return ch.code, ch.body, nil
}

func (s *MemoryStore) stored(_ context.Context, id string) (int, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byID[id]
	if !ok || ch.state != stateCompleted {
		return 0, nil, fmt.Errorf("read charge %s: not completed", id)
	}
	return ch.code, ch.body, nil
}

func (s *MemoryStore) release(_ context.Context, c claim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.byID[c.id]
	if ok && ch.state == stateInFlight && ch.createdAt.Equal(c.at) {
		delete(s.byID, ch.id)
		delete(s.byKey, ch.key)
	}
	return nil
}

func (s *MemoryStore) ping(context.Context) error { return nil }

// later returns t, or a nanosecond after prev if t is not after it (a coarse clock).
func later(t, prev time.Time) time.Time {
	if t.After(prev) {
		return t
	}
	return prev.Add(time.Nanosecond)
}
