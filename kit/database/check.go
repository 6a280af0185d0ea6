package database

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// ErrReadOnly means the database answers but cannot take writes: a standby
// after a failover, or default_transaction_read_only.
var ErrReadOnly = errors.New("database is read-only")

// Checker asks the database whether it can take writes, on a connection of its
// own: a pool busy with workers never delays the answer, and every check dials
// anew, so it sees a failover or a database turned read-only since the pool's
// connections were opened.
type Checker struct {
	db *sql.DB
}

// NewChecker returns a Checker of the database at url; it connects on Check.
func NewChecker(url string) (*Checker, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	cc.RuntimeParams["application_name"] = "health-check"
	db := stdlib.OpenDB(*cc)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(0) // a fresh session each time
	return &Checker{db: db}, nil
}

// Check returns nil if the database answers and can take writes.
func (c *Checker) Check(ctx context.Context) error {
	var recovery bool
	var readOnly string
	err := c.db.QueryRowContext(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')`).Scan(&recovery, &readOnly)
	switch {
	case err != nil:
		return fmt.Errorf("check database: %w", err)
	case recovery:
		return fmt.Errorf("%w: in recovery (a standby)", ErrReadOnly)
	case readOnly == "on":
		return fmt.Errorf("%w: transactions are read-only (default_transaction_read_only)", ErrReadOnly)
	}
	return nil
}

// Close closes the checker's connection.
func (c *Checker) Close() error { return c.db.Close() }
