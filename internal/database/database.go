// Package database opens the PostgreSQL pools the programs use: a GORM handle over
// pgx with bounded connections and server-side timeouts, so that a hung statement
// or a transaction abandoned by a crashed worker never holds locks for long.
package database

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Options tune a pool.
type Options struct {
	URL              string
	MaxConns         int
	StatementTimeout time.Duration
	AppName          string
}

// Open connects to PostgreSQL and checks the connection with a ping.
func Open(ctx context.Context, o Options, log *slog.Logger) (*gorm.DB, error) {
	cc, err := pgx.ParseConfig(o.URL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if o.StatementTimeout > 0 {
		ms := strconv.FormatInt(o.StatementTimeout.Milliseconds(), 10)
		cc.RuntimeParams["statement_timeout"] = ms
		cc.RuntimeParams["lock_timeout"] = ms
		// A worker that vanishes mid-transaction must not hold the inbox row lock.
		cc.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(4*o.StatementTimeout.Milliseconds(), 10)
	}
	if o.AppName != "" {
		cc.RuntimeParams["application_name"] = o.AppName
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	sqlDB := stdlib.OpenDB(*cc)
	sqlDB.SetMaxOpenConns(max(o.MaxConns, 2))
	sqlDB.SetMaxIdleConns(max(o.MaxConns, 2))
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{
		Logger: logger.NewSlogLogger(log.With("component", "gorm"), logger.Config{
			SlowThreshold:             time.Second,
			LogLevel:                  logger.Warn,
			IgnoreRecordNotFoundError: true,
		}),
		SkipDefaultTransaction: true,
	})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("open database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("ping database: %w", err)
	}
	return db, nil
}

// Close closes the pool behind db.
func Close(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// Ping checks that the database answers.
func Ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// IsUnavailable reports whether err is PostgreSQL (or the way to it) failing,
// as opposed to PostgreSQL rejecting a statement: the caller should hold the work
// back until the database returns rather than count it against the message. It
// only recognises errors that come from the driver; callers that also see other
// network errors (an HTTP call in the same transaction) should ping to be sure.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		// connection exception, admin/crash shutdown, cannot connect now, too many connections
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") || code == "53300"
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || errors.Is(err, driver.ErrBadConn) || pgconn.SafeToRetry(err)
}
