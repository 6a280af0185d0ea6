// Package database opens the PostgreSQL pools the programs use: a GORM handle over
// pgx with bounded connections and server-side timeouts, so that a hung statement
// or a transaction abandoned by a crashed worker never holds locks for long.
package database

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Options tune a pool.
type Options struct {
	URL              string
	MaxConns         int
	StatementTimeout time.Duration
	AppName          string
	// ReadOnly makes every transaction of the pool's sessions read only
	// (default_transaction_read_only): PostgreSQL refuses any write made
	// through it, SQLSTATE 25006.
	ReadOnly bool
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
	// A statement run with CustomPlan gets its results as text: pgx reads
	// bytea only in hex and timestamps only in the ISO style, whatever the
	// database's defaults.
	cc.RuntimeParams["bytea_output"] = "hex"
	cc.RuntimeParams["datestyle"] = "ISO, MDY"
	if o.ReadOnly {
		cc.RuntimeParams["default_transaction_read_only"] = "on"
		// A handler's reads are its own statements, one or two a message:
		// each is planned for its parameters, never from a generic plan
		// cached while its table was empty (see CustomPlan).
		cc.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 5 * time.Second
	}
	n := o.MaxConns
	if n < 1 {
		n = 2
	}
	sqlDB := stdlib.OpenDB(*cc)
	sqlDB.SetMaxOpenConns(n)
	sqlDB.SetMaxIdleConns(n)
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{
		Logger:                 newQuietLogger(log.With("component", "gorm"), time.Second),
		SkipDefaultTransaction: true,
	})
	if err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("open database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		_ = sqlDB.Close()
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

// Recycle closes the pool's idle connections, so that the next statements run
// on new sessions: a session opened while the database was read-only (a
// failover, a full disk) stays read-only after the database recovers.
func Recycle(db *gorm.DB) {
	sqlDB, err := db.DB()
	if err != nil {
		return
	}
	n := sqlDB.Stats().MaxOpenConnections
	sqlDB.SetMaxIdleConns(0) // closes every idle connection
	sqlDB.SetMaxIdleConns(n)
}

// Ping checks that the database answers.
func Ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// CustomPlan, given as a statement's first argument (before its
// parameters), runs the statement unprepared, so that PostgreSQL plans it
// for its parameters at every execution. The pool otherwise prepares each
// statement once per connection, and after five executions PostgreSQL may
// keep a generic plan: one made while a table was empty (a fresh database,
// a new service) is a sequential scan, and it stays one, however big the
// table grows, until autovacuum analyzes the table. For the look-ups of
// many ids in the inbox that cost seconds of latency under a steady load:
// every batch read the whole table. Planning costs a little each time; give
// it to the statements that read a growing table by a list of keys. Such a
// statement's results come back as text, which Open's pools keep in the
// formats pgx parses (bytea_output hex, DateStyle ISO).
const CustomPlan = pgx.QueryExecModeExec
