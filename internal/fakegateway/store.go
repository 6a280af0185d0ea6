package fakegateway

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Row states of the table charges.
const (
	stateInFlight  = "in_flight"
	stateCompleted = "completed"
)

// store is the idempotency store: every statement commits on its own, so that
// the in-flight row is visible to concurrent requests before the charge runs.
type store struct {
	db *gorm.DB
}

// claim is a request's ownership of an in-flight row.
type claim struct {
	id string
	at time.Time // created_at as this request set it
}

// existing is what a request needs to know about a key that is already taken.
type existing struct {
	id          string
	fingerprint []byte
	state       string
	createdAt   time.Time
	stale       bool // in flight for longer than the takeover age, by the database clock
}

// claim inserts the key in flight and reports whether this request owns it.
// RETURNING yields a row only when the insert happened, which is the same test
// as one row affected, and gives the claim's time for the guards below.
func (s store) claim(ctx context.Context, id, key string, fp []byte, req chargeRequest) (claim, bool, error) {
	c := claim{id: id}
	err := s.db.WithContext(ctx).Raw(`
		INSERT INTO charges (id, idempotency_key, request_sha256, order_id, customer_id, amount_cents, currency, state)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (idempotency_key) DO NOTHING
		RETURNING created_at`,
		id, key, fp, req.OrderID, req.CustomerID, req.AmountCents, req.Currency, stateInFlight).Row().Scan(&c.at)
	switch {
	case isNoRows(err):
		return c, false, nil
	case err != nil:
		return c, false, fmt.Errorf("claim key: %w", err)
	}
	return c, true, nil
}

// lookup reads a taken key. It returns sql.ErrNoRows when the key was released
// in between, which callers treat like a request still in flight.
func (s store) lookup(ctx context.Context, key string, takeover time.Duration) (existing, error) {
	var e existing
	err := s.db.WithContext(ctx).Raw(`
		SELECT id, request_sha256, state, created_at,
		       state = 'in_flight' AND created_at < now() - make_interval(secs => ?)
		FROM charges WHERE idempotency_key = ?`,
		takeover.Seconds(), key).Row().Scan(&e.id, &e.fingerprint, &e.state, &e.createdAt, &e.stale)
	if err != nil {
		return e, fmt.Errorf("look up key: %w", err)
	}
	return e, nil
}

// takeOver claims an abandoned in-flight row. The guard on the created_at that
// was read makes exactly one of several concurrent takers win; the winner resets
// created_at so that the row is not presumed abandoned again at once.
func (s store) takeOver(ctx context.Context, e existing) (claim, bool, error) {
	c := claim{id: e.id}
	err := s.db.WithContext(ctx).Raw(`
		UPDATE charges SET created_at = now()
		WHERE id = ? AND state = ? AND created_at = ?
		RETURNING created_at`,
		e.id, stateInFlight, e.createdAt).Row().Scan(&c.at)
	switch {
	case isNoRows(err):
		return c, false, nil
	case err != nil:
		return c, false, fmt.Errorf("take over key: %w", err)
	}
	return c, true, nil
}

// complete stores the outcome and the exact response. It reports false when the
// row was completed already: a request presumed dead and taken over finished
// after all, and the first stored response stands.
func (s store) complete(ctx context.Context, resp chargeResponse, code int, body []byte) (bool, error) {
	var reason *string
	if resp.DeclineReason != "" {
		reason = &resp.DeclineReason
	}
	res := s.db.WithContext(ctx).Exec(`
		UPDATE charges
		SET state = ?, status = ?, decline_reason = ?, response_code = ?, response_body = ?, completed_at = now()
		WHERE id = ? AND state = ?`,
		stateCompleted, resp.Status, reason, code, body, resp.ID, stateInFlight)
	if res.Error != nil {
		return false, fmt.Errorf("complete charge %s: %w", resp.ID, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// replay counts a replay and returns the stored response.
func (s store) replay(ctx context.Context, key string) (int, []byte, error) {
	var code int
	var body []byte
	err := s.db.WithContext(ctx).Raw(`
		UPDATE charges SET replays = replays + 1
		WHERE idempotency_key = ? AND state = ?
		RETURNING response_code, response_body`,
		key, stateCompleted).Row().Scan(&code, &body)
	if err != nil {
		return 0, nil, fmt.Errorf("replay key: %w", err)
	}
	return code, body, nil
}

// stored returns the response of a completed charge.
func (s store) stored(ctx context.Context, id string) (int, []byte, error) {
	var code int
	var body []byte
	err := s.db.WithContext(ctx).Raw(`
		SELECT response_code, response_body FROM charges WHERE id = ? AND state = ?`,
		id, stateCompleted).Row().Scan(&code, &body)
	if err != nil {
		return 0, nil, fmt.Errorf("read charge %s: %w", id, err)
	}
	return code, body, nil
}

// release deletes a claim whose charge never ran, so that a retry executes it
// at once instead of waiting for the takeover age. The guard on the claim's time
// keeps a slow request from deleting the claim of the request that took it over.
func (s store) release(ctx context.Context, c claim) error {
	res := s.db.WithContext(ctx).Exec(`DELETE FROM charges WHERE id = ? AND state = ? AND created_at = ?`,
		c.id, stateInFlight, c.at)
	if res.Error != nil {
		return fmt.Errorf("release charge %s: %w", c.id, res.Error)
	}
	return nil
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
