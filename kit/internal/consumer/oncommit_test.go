package consumer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"
)

// OnCommit runs after the transaction of the writes that registered it has
// committed, in both modes and with group commit or not; never for writes
// that failed (their savepoint or transaction rolled back), and nothing
// registers outside the runtime's writes.
func TestOnCommitRunsOnlyAfterTheCommit(t *testing.T) {
	t.Parallel()
	if OnCommit(context.Background(), func() {}) {
		t.Fatal("OnCommit registered outside the runtime's writes")
	}
	for _, mode := range []string{"inline", "buffered"} {
		t.Run(mode, func(t *testing.T) {
			e := newBufferedEnv(t, nil)
			var committed, wrong atomic.Int64
			h := HandlerFunc(func(ctx context.Context, msg Message) (Writes, error) {
				return func(ctx context.Context, tx *gorm.DB) (Outcome, error) {
					if msg.ID == "fails" {
						OnCommit(ctx, func() { wrong.Add(1) })
						return "", Permanent(NewReason("bad_data"), errors.New("the write fails"))
					}
					if !OnCommit(ctx, func() {
						if e.effects(msg.ID) != 1 { // visible: committed
							wrong.Add(1)
						}
						committed.Add(1)
					}) {
						t.Error("OnCommit refused inside the writes")
					}
					return recordWrites(msg)(ctx, tx)
				}, nil
			})
			rt := e.start(h, func(c *Config) {
				if mode == "buffered" {
					withBuffered(e.db, e.dbURL, nil)(c)
				}
			})
			e.publishMany(20, "ok")
			e.publish("fails", `{"key":"k","n":1}`)
			waitFor(t, "all settled", func() bool {
				return committed.Load() == 20 && rt.count(OutcomeDeadLettered)+rt.count(OutcomeParked) == 1
			})
			if wrong.Load() != 0 {
				t.Errorf("%d hooks ran before their commit or for writes that rolled back", wrong.Load())
			}
		})
	}
}
