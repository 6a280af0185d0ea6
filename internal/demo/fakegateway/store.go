package fakegateway

import (
	"context"
	"errors"
	"time"
)

// Row states of a charge.
const (
	stateInFlight  = "in_flight"
	stateCompleted = "completed"
)

// errKeyReleased means that a taken key is gone again: the request that held it
// was abandoned by its client and released its claim.
var errKeyReleased = errors.New("idempotency key released")

// Store keeps one charge per idempotency key. Each method takes effect on its
// own, so that an in-flight claim is visible to concurrent requests before the
// charge runs. Its methods are unexported: PostgresStore and MemoryStore are
// its implementations, and one contract test suite runs against both.
type Store interface {
	// claim stores the key in flight and reports whether this request owns it.
	claim(ctx context.Context, id, key string, fp []byte, req chargeRequest) (claim, bool, error)
	// lookup reads a taken key; errKeyReleased if it was released since.
	// A completed key older than keyTTL (0: never) is expired.
	lookup(ctx context.Context, key string, takeover, keyTTL time.Duration) (existing, error)
	// forget releases the key of an expired charge, which stays stored: the
	// next claim of the key is a new charge. It reports whether this call
	// released it: of concurrent forgetters exactly one does.
	forget(ctx context.Context, e existing) (bool, error)
	// takeOver claims an abandoned in-flight charge; exactly one of several
	// takers holding the same snapshot wins, and the winner's claim is young again.
	takeOver(ctx context.Context, e existing) (claim, bool, error)
	// complete stores the outcome and the exact response. It reports false when
	// the charge was completed already: a request presumed dead and taken over
	// finished after all, and the first stored response stands.
	complete(ctx context.Context, resp chargeResponse, code int, body []byte) (bool, error)
	// replay counts a replay of a completed key and returns its stored response.
	replay(ctx context.Context, key string) (int, []byte, error)
	// stored returns the response of a completed charge.
	stored(ctx context.Context, id string) (int, []byte, error)
	// release deletes a claim whose charge never ran, unless another request
	// has taken the key over since (its claim time differs).
	release(ctx context.Context, c claim) error
	// ping reports whether the store can serve requests.
	ping(ctx context.Context) error
}

// claim is a request's ownership of an in-flight charge.
type claim struct {
	id string
	at time.Time // the claim time as this request set it
}

// existing is what a request needs to know about a key that is already taken.
type existing struct {
	id          string
	fingerprint []byte
	state       string
	createdAt   time.Time
	stale       bool // in flight for longer than the takeover age, by the store's clock
	expired     bool // completed longer ago than the key's lifetime, by the store's clock
}
