package consumer

import "context"

// OnCommit registers f to run once the transaction of the writes that call it
// has committed: never if it rolls back, nor for a run of the writes that a
// later run replaced (the writes may run more than once; only the last run's
// registrations stand). It reports false, and registers nothing, outside the
// writes of the runtime (a transaction of the caller's own, say), where the
// caller must act after its own commit. The outbox wakes its relay this way.
// f runs on the committer's goroutine: keep it short, and never block.
func OnCommit(ctx context.Context, f func()) bool {
	h, ok := ctx.Value(commitHooksKey{}).(*commitHooks)
	if ok {
		h.fns = append(h.fns, f)
	}
	return ok
}

type commitHooksKey struct{}

// commitHooks collects one message's OnCommit functions of its writes' last run.
type commitHooks struct{ fns []func() }

// run starts a run of the writes: what an earlier run registered
// is dropped.
func (h *commitHooks) run(ctx context.Context) context.Context {
	h.fns = h.fns[:0]
	return context.WithValue(ctx, commitHooksKey{}, h)
}

// committed runs the registered functions.
func (h *commitHooks) committed() {
	for _, f := range h.fns {
		f()
	}
}

// CommitHooks gives writes run in a transaction of the caller's own (a test
// harness, a backfill) what the runtime gives them: run the writes with the
// returned context, then call committed once the transaction has committed,
// and never if it rolled back. Each call starts a fresh set.
func CommitHooks(ctx context.Context) (run context.Context, committed func()) {
	h := &commitHooks{}
	return h.run(ctx), h.committed
}
