package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/internal/inbox"
)

// committer runs the final transactions of messages: their inbox claim and
// their handler's writes. A fixed number of committers (Config.Committers)
// each take a batch of up to GroupCommitMax messages that finished their
// handler close together (waiting at most GroupCommitWait for the batch to
// fill) and commit them in one transaction, a savepoint each. So the database
// sees a bounded number of connections whatever the number of workers, and one
// COMMIT (one WAL flush) for many messages. With GroupCommitMax 1 every
// message has its own transaction.
type committer struct {
	inbox   *inbox.Inbox
	max     int
	wait    time.Duration
	timeout time.Duration // bounds one batch's transaction
	jobs    chan *commitJob
	stage   func(Stage)
	metrics *Metrics
	name    string
}

// commitJob is one message waiting for its commit, and then its result.
type commitJob struct {
	msg    Message
	writes Writes
	out    Outcome
	fresh  bool
	err    error
	done   chan struct{}
}

// commit hands a message's writes to the committers and waits for the
// transaction that holds them. If ctx ends first the message is given up
// unacked: its writes may still commit, and its redelivery is then a duplicate.
func (c *committer) commit(ctx context.Context, msg Message, w Writes) (out Outcome, fresh bool, err error) {
	j := &commitJob{msg: msg, writes: w, done: make(chan struct{})}
	select {
	case c.jobs <- j:
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
	select {
	case <-j.done:
		return j.out, j.fresh, j.err
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
}

// run starts n committers; they stop when ctx ends. The caller waits on wg.
func (c *committer) run(ctx context.Context, n int, wg *sync.WaitGroup) {
	for range n {
		wg.Go(func() {
			for {
				select {
				case j := <-c.jobs:
					c.commitBatch(ctx, c.gather(ctx, j))
				case <-ctx.Done():
					return
				}
			}
		})
	}
}

// gather collects a batch: first, what is already waiting, then what arrives
// within the wait, up to the maximum.
func (c *committer) gather(ctx context.Context, first *commitJob) []*commitJob {
	batch := []*commitJob{first}
	for len(batch) < c.max { // what is waiting already
		select {
		case j := <-c.jobs:
			batch = append(batch, j)
			continue
		default:
		}
		break
	}
	if len(batch) == c.max || c.wait == 0 {
		return batch
	}
	timer := time.NewTimer(c.wait)
	defer timer.Stop()
	for len(batch) < c.max {
		select {
		case j := <-c.jobs:
			batch = append(batch, j)
		case <-timer.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// commitBatch runs one transaction for the batch and hands each job its result.
func (c *committer) commitBatch(ctx context.Context, batch []*commitJob) {
	// Detached from shutdown: a batch that has begun commits or fails on its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	items := make([]inbox.Item, len(batch))
	for i, j := range batch {
		items[i] = inbox.Item{MessageID: j.msg.ID, Body: j.msg.Body, Apply: c.apply(ctx, j)}
	}
	c.metrics.batchSize.WithLabelValues(c.name).Observe(float64(len(batch)))
	start := time.Now()
	results, err := c.inbox.Commit(ctx, items)
	c.metrics.commitSeconds.WithLabelValues(c.name).Observe(time.Since(start).Seconds())
	for i, j := range batch {
		switch {
		case err != nil:
			j.out, j.fresh, j.err = "", false, fmt.Errorf("commit: %w", err)
		case results[i].Err != nil:
			j.out, j.fresh, j.err = "", false, results[i].Err
		default:
			j.fresh = results[i].Fresh
		}
		close(j.done)
	}
}

// apply runs a job's writes after its claim, keeping the outcome they report.
func (c *committer) apply(ctx context.Context, j *commitJob) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		c.stage(StageClaimed)
		j.out = ""
		if j.writes == nil {
			return nil
		}
		out, err := j.writes(ctx, tx)
		j.out = out
		return err
	}
}
