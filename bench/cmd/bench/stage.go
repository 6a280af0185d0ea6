package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// stage is one configuration's own piece of the servers: a database with the
// payments schema and, for a consumer, a vhost with the service's topology.
type stage struct {
	name    string
	run     string // order ids are <run>-<n>
	dbName  string
	dbURL   string
	vhost   string
	amqpURL string
}

// newStage creates the stage and returns the function that removes it again.
// declare, if not nil, declares the topology in a vhost of the stage's own;
// nil gives the stage no vhost.
func (b *bench) newStage(ctx context.Context, name string, declare func(amqpURL string) error) (*stage, func(), error) {
	st := &stage{name: name, run: b.prefix + "-" + name, dbName: b.prefix + "_" + strings.ReplaceAll(name, "-", "_")}
	var undo []func(context.Context) error
	cleanup := func() {
		if b.o.keep {
			b.logf("kept database %s and vhost %s", st.dbName, st.vhost)
			return
		}
		// The run may have been interrupted: clean up on a context of its own.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](ctx); err != nil {
				b.logf("clean-up: %v", err)
			}
		}
	}
	fail := func(err error) (*stage, func(), error) {
		cleanup()
		return nil, nil, err
	}
	var err error
	if st.dbURL, err = b.pg.Create(ctx, st.dbName); err != nil {
		return fail(err)
	}
	undo = append(undo, func(ctx context.Context) error { return b.pg.Drop(ctx, st.dbName) })
	if err := b.migrate(ctx, st.dbURL); err != nil {
		return fail(err)
	}
	if declare == nil {
		return st, cleanup, nil
	}
	st.vhost = strings.ReplaceAll(st.dbName, "_", "-")
	if st.amqpURL, err = b.ctl.AddVHost(ctx, b.o.amqpURL, st.vhost); err != nil {
		return fail(err)
	}
	undo = append(undo, func(ctx context.Context) error { return b.ctl.DeleteVHost(ctx, st.vhost) })
	if err := declare(st.amqpURL); err != nil {
		return fail(err)
	}
	return st, cleanup, nil
}

// migrate applies the payment service's schemas (the inbox, then payments)
// with the template's inboxctl.
func (b *bench) migrate(ctx context.Context, dbURL string) error {
	cmd := exec.CommandContext(ctx, b.bin("inboxctl"), "migrate")
	cmd.Env = []string{"DATABASE_URL=" + dbURL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("inboxctl migrate: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// bin is the path of a built program.
func (b *bench) bin(program string) string { return filepath.Join(b.o.binDir, program) }
