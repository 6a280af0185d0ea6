// Package inboxtx is the peers' unit of work: the payment service's inbox claim
// and payment insert, in one transaction, with pgx and no gateway call, against
// the template's schema (applied by inboxctl migrate). The statements are the
// ones the service runs through GORM.
package inboxtx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPayloadMismatch means that a message id was applied before with another body.
var ErrPayloadMismatch = errors.New("message id already applied with a different payload")

// Order is the part of OrderPlaced the payment row needs.
type Order struct {
	EventID     string `json:"event_id"`
	OrderID     string `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// Decode reads an OrderPlaced body.
func Decode(body []byte) (Order, error) {
	var o Order
	if err := json.Unmarshal(body, &o); err != nil {
		return o, fmt.Errorf("decode OrderPlaced: %w", err)
	}
	if o.EventID == "" || o.OrderID == "" {
		return o, errors.New("decode OrderPlaced: event_id and order_id are required")
	}
	return o, nil
}

// Open connects a pool of at most conns connections, named app in pg_stat_activity.
func Open(ctx context.Context, dbURL, app string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return pool, nil
}

// Apply claims messageID for consumer in the inbox and, if it is new, inserts
// the order's payment, in one transaction. It reports whether the message was
// new; a duplicate commits nothing but its check.
func Apply(ctx context.Context, pool *pgxpool.Pool, consumer, messageID string, body []byte, o Order) (fresh bool, err error) {
	sum := sha256.Sum256(body)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO inbox (message_id, consumer, payload_sha256) VALUES ($1, $2, $3)
			ON CONFLICT DO NOTHING`, messageID, consumer, sum[:])
		if err != nil {
			return fmt.Errorf("claim message %s: %w", messageID, err)
		}
		if tag.RowsAffected() == 0 {
			return checkSame(ctx, tx, consumer, messageID, sum[:])
		}
		fresh = true
		_, err = tx.Exec(ctx, `INSERT INTO payments (order_id, message_id, customer_id, amount_cents, currency, status, charge_id)
			VALUES ($1, $2, $3, $4, $5, 'succeeded', $6) ON CONFLICT (order_id) DO NOTHING`,
			o.OrderID, messageID, o.CustomerID, o.AmountCents, o.Currency, "ch_"+o.OrderID)
		if err != nil {
			return fmt.Errorf("insert payment of order %s: %w", o.OrderID, err)
		}
		return nil
	})
	return fresh, err
}

// checkSame compares a duplicate's body with the one applied, as the service does.
func checkSame(ctx context.Context, tx pgx.Tx, consumer, messageID string, sum []byte) error {
	var seen []byte
	err := tx.QueryRow(ctx, `SELECT payload_sha256 FROM inbox WHERE message_id = $1 AND consumer = $2`,
		messageID, consumer).Scan(&seen)
	if err != nil {
		return fmt.Errorf("read inbox entry of message %s: %w", messageID, err)
	}
	if !bytes.Equal(seen, sum) {
		return fmt.Errorf("message %s: %w", messageID, ErrPayloadMismatch)
	}
	return nil
}
