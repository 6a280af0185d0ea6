// Package scratchdb gives each bench configuration a fresh PostgreSQL database,
// counts what the consumer committed there, samples the connections the
// consumer holds to it, and reads the outbox's backlog.
package scratchdb

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ObserverApp is the application_name of the bench's own connections, which the
// connection samples leave out.
const ObserverApp = "bench-observer"

// Server is a PostgreSQL server reached through an admin URL (a superuser on
// an existing database, such as postgres).
type Server struct {
	AdminURL string
}

func (s Server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact(s.AdminURL), err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// Create makes an empty database and returns its URL.
func (s Server) Create(ctx context.Context, name string) (string, error) {
	if err := s.exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(s.AdminURL)
	if err != nil {
		return "", fmt.Errorf("parse the admin URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// Drop deletes the database, closing the sessions still in it.
func (s Server) Drop(ctx context.Context, name string) error {
	if err := s.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// Version is the server's version string, e.g. "PostgreSQL 15.20 (Debian …) on x86_64…".
func (s Server) Version(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v string
	err = conn.QueryRow(ctx, "SELECT version()").Scan(&v)
	return v, err
}

// Durability shows the settings that trade durability for speed, which a
// benchmark must not have changed: "fsync on, synchronous_commit on".
func (s Server) Durability(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var fsync, syncCommit string
	err = conn.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit)
	return "fsync " + fsync + ", synchronous_commit " + syncCommit, err
}

// Observer is one connection to a bench database, for the bench's own queries.
type Observer struct {
	conn *pgx.Conn
	db   string
}

// Observe connects to the database at dbURL as ObserverApp.
func Observe(ctx context.Context, dbURL string) (*Observer, error) {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = ObserverApp
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Database, err)
	}
	return &Observer{conn: conn, db: cfg.Database}, nil
}

// Close closes the connection.
func (o *Observer) Close(ctx context.Context) error { return o.conn.Close(ctx) }

// Payments counts the rows of the payments table.
func (o *Observer) Payments(ctx context.Context) (int, error) {
	var n int
	err := o.conn.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&n)
	return n, err
}

// Succeeded counts the payments that succeeded: those that emit OrderPaid.
func (o *Observer) Succeeded(ctx context.Context) (int, error) {
	var n int
	err := o.conn.QueryRow(ctx, "SELECT count(*) FROM payments WHERE status = 'succeeded'").Scan(&n)
	return n, err
}

// Connections is a peak of the consumer's sessions in its database.
type Connections struct {
	Open int // sessions connected
	Busy int // sessions not idle: running a statement, or inside a transaction
}

// SampleConnections counts the database's sessions other than the bench's own
// every interval until ctx ends, and returns the peaks through the function it
// returns, which waits for the sampler to stop.
func (o *Observer) SampleConnections(ctx context.Context, admin Server, every time.Duration) func() (Connections, error) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		peak Connections
		err  error
	)
	wg.Go(func() { peak, err = sample(ctx, admin, o.db, every) })
	return func() (Connections, error) {
		cancel()
		wg.Wait()
		return peak, err
	}
}

func sample(ctx context.Context, admin Server, db string, every time.Duration) (Connections, error) {
	var peak Connections
	conn, err := pgx.Connect(ctx, admin.AdminURL) // outside db, so it is not counted
	if err != nil {
		return peak, fmt.Errorf("connect to sample connections: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var c Connections
		err := conn.QueryRow(ctx, `
			SELECT count(*), count(*) FILTER (WHERE state IS DISTINCT FROM 'idle')
			FROM pg_stat_activity
			WHERE datname = $1 AND application_name <> $2 AND backend_type = 'client backend'`,
			db, ObserverApp).Scan(&c.Open, &c.Busy)
		if ctx.Err() != nil {
			return peak, nil
		}
		if err != nil {
			return peak, fmt.Errorf("sample connections: %w", err)
		}
		peak.Open, peak.Busy = max(peak.Open, c.Open), max(peak.Busy, c.Busy)
		select {
		case <-ctx.Done():
			return peak, nil
		case <-tick.C:
		}
	}
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "the admin URL"
	}
	return u.Redacted()
}

// OutboxSample is the outbox at one moment.
type OutboxSample struct {
	At      time.Time
	Pending int           // rows committed and not yet marked sent
	Oldest  time.Duration // now() less the oldest pending row's created_at; 0 when none is pending
}

// outboxNow reads the pending rows and the age of the oldest, by the
// database's clock: created_at is the start of the row's transaction, so
// the age counts the transaction's commit too.
const outboxNow = `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
	FROM outbox WHERE status = 'pending'`

// Outbox reads the outbox now. It counts the pending rows: cheap while
// the relay keeps up, not for polling a backlog (OutboxDrained).
func (o *Observer) Outbox(ctx context.Context) (OutboxSample, error) {
	s := OutboxSample{At: time.Now()}
	var age float64
	if err := o.conn.QueryRow(ctx, outboxNow).Scan(&s.Pending, &age); err != nil {
		return s, fmt.Errorf("read the outbox: %w", err)
	}
	s.Oldest = time.Duration(age * float64(time.Second))
	return s, nil
}

// OutboxDrained reports whether no outbox row is pending. It looks for one
// row only, so that polling a backlog of many does not load the database.
func (o *Observer) OutboxDrained(ctx context.Context) (bool, error) {
	var drained bool
	err := o.conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE status = 'pending')`).Scan(&drained)
	if err != nil {
		return false, fmt.Errorf("look for pending outbox rows: %w", err)
	}
	return drained, nil
}

// OutboxCounts are the outbox's rows by status.
type OutboxCounts struct {
	Pending, Sent, Parked int
}

// OutboxCounts counts the outbox's rows by status.
func (o *Observer) OutboxCounts(ctx context.Context) (OutboxCounts, error) {
	var c OutboxCounts
	err := o.conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'sent'),
			count(*) FILTER (WHERE status = 'parked') FROM outbox`).Scan(&c.Pending, &c.Sent, &c.Parked)
	if err != nil {
		return c, fmt.Errorf("count the outbox's rows: %w", err)
	}
	return c, nil
}

// SampleOutbox reads the outbox (Observer.Outbox) every interval, on a
// connection of its own, until the function it returns is called; that
// waits for the sampler to stop and returns the samples, oldest first.
func SampleOutbox(ctx context.Context, dbURL string, every time.Duration) func() ([]OutboxSample, error) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		samples []OutboxSample
		err     error
	)
	wg.Go(func() { samples, err = sampleOutbox(ctx, dbURL, every) })
	return func() ([]OutboxSample, error) {
		cancel()
		wg.Wait()
		return samples, err
	}
}

func sampleOutbox(ctx context.Context, dbURL string, every time.Duration) ([]OutboxSample, error) {
	obs, err := Observe(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer obs.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(every)
	defer tick.Stop()
	var samples []OutboxSample
	for {
		s, err := obs.Outbox(ctx)
		if ctx.Err() != nil {
			return samples, nil
		}
		if err != nil {
			return samples, err
		}
		samples = append(samples, s)
		select {
		case <-ctx.Done():
			return samples, nil
		case <-tick.C:
		}
	}
}
