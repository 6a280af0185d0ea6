package fakegateway

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
)

// PostgresStore keeps charges in the table charges of a database migrated with
// Migrations: every statement commits on its own. It is the store of
// the fault scripts and of inboxctl verify, which reads that table.
type PostgresStore struct {
	db *gorm.DB
}

// NewPostgresStore returns the store over db.
func NewPostgresStore(db *gorm.DB) *PostgresStore {
	return &PostgresStore{db: db}
}

// claim inserts the key in flight and reports whether this request owns it.
// RETURNING yields a row only when the insert happened, which is the same test
// as one row affected, and gives the claim's time for the guards below.
func (s *PostgresStore) claim(ctx context.Context, id, key string, fp []byte, req chargeRequest) (claim, bool, error) {
	c := claim{id: id}
	err := s.db.WithContext(ctx).Raw(`
		INSERT INTO charges (id, idempotency_key, request_sha256, order_id, customer_id, amount_cents, currency, state)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (idempotency_key) WHERE forgotten_at IS NULL DO NOTHING
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

// lookup reads a taken key, by the database clock.
func (s *PostgresStore) lookup(ctx context.Context, key string, takeover, keyTTL time.Duration) (existing, error) {
	var e existing
	err := s.db.WithContext(ctx).Raw(`
		SELECT id, request_sha256, state, created_at,
		       state = 'in_flight' AND created_at < now() - make_interval(secs => ?),
		       state = 'completed' AND ? > 0 AND completed_at < now() - make_interval(secs => ?)
		FROM charges WHERE idempotency_key = ? AND forgotten_at IS NULL`,
		takeover.Seconds(), keyTTL.Seconds(), keyTTL.Seconds(), key).Row().
		Scan(&e.id, &e.fingerprint, &e.state, &e.createdAt, &e.stale, &e.expired)
	switch {
	case isNoRows(err):
		return e, errKeyReleased
	case err != nil:
		return e, fmt.Errorf("look up key: %w", err)
	}
	return e, nil
}

// forget releases the key of an expired charge; the row stays, since the
// charge happened.
func (s *PostgresStore) forget(ctx context.Context, e existing) (bool, error) {
	res := s.db.WithContext(ctx).Exec(`UPDATE charges SET forgotten_at = now() WHERE id = ? AND forgotten_at IS NULL`, e.id)
	if res.Error != nil {
		return false, fmt.Errorf("forget charge %s: %w", e.id, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// takeOver claims an abandoned in-flight row. The guard on the created_at that
// was read makes exactly one of several concurrent takers win; the winner resets
// created_at so that the row is not presumed abandoned again at once.
func (s *PostgresStore) takeOver(ctx context.Context, e existing) (claim, bool, error) {
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

// complete stores the outcome and the exact response in the row.
func (s *PostgresStore) complete(ctx context.Context, resp chargeResponse, code int, body []byte) (bool, error) {
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
func (s *PostgresStore) replay(ctx context.Context, key string) (int, []byte, error) {
	var code int
	var body []byte
	err := s.db.WithContext(ctx).Raw(`
		UPDATE charges SET replays = replays + 1
		WHERE idempotency_key = ? AND state = ? AND forgotten_at IS NULL
		RETURNING response_code, response_body`,
		key, stateCompleted).Row().Scan(&code, &body)
	if err != nil {
		return 0, nil, fmt.Errorf("replay key: %w", err)
	}
	return code, body, nil
}

// stored returns the response of a completed charge.
func (s *PostgresStore) stored(ctx context.Context, id string) (int, []byte, error) {
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
func (s *PostgresStore) release(ctx context.Context, c claim) error {
	res := s.db.WithContext(ctx).Exec(`DELETE FROM charges WHERE id = ? AND state = ? AND created_at = ?`,
		c.id, stateInFlight, c.at)
	if res.Error != nil {
		return fmt.Errorf("release charge %s: %w", c.id, res.Error)
	}
	return nil
}

func (s *PostgresStore) ping(ctx context.Context) error { return database.Ping(ctx, s.db) }

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
