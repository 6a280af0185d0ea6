package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/tracing"
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
	*batcher[*commitJob]
	inbox   *inbox.Inbox
	timeout time.Duration // bounds one batch's transaction
	stage   func(Stage)
	metrics *Metrics
	name    string
	tracer  *tracing.Tracer
	queue   string // the settle spans' destination
}

func newCommitter(ib *inbox.Inbox, max int, wait, timeout time.Duration, stage func(Stage), m *Metrics, name string) *committer {
	c := &committer{inbox: ib, timeout: timeout, stage: stage, metrics: m, name: name}
	c.batcher = newBatcher(max, wait, c.commitBatch)
	return c
}

// commitJob is one message waiting for its commit, and then its result.
type commitJob struct {
	msg    Message
	writes Writes
	hooks  commitHooks // OnCommit of the writes' last run
	acks   *acker      // its session's: the committer acks it once committed
	tag    uint64
	out    Outcome
	fresh  bool
	ack    sentAck
	err    error
	span   tracing.Span // the delivery's process span
	commit tracing.Span // the span of its commit
	owner  atomic.Int32 // ownerNone, then whoever settles the delivery
	done   chan struct{}
}

// sentAck says whether a message's ack was sent for it, and its error.
type sentAck struct {
	sent bool
	err  error
}

// commit hands a message's writes to the committers and waits for the
// transaction that holds them and for its ack (delivery tag on the session's
// acker), sent with those of the rest of the batch. If ctx ends first the
// message is given up unacked: its writes may still commit, and its
// redelivery is then a duplicate.
func (c *committer) commit(ctx context.Context, msg Message, w Writes, acks *acker, tag uint64, span tracing.Span) (out Outcome, fresh bool, ack sentAck, err error) {
	j := &commitJob{msg: msg, writes: w, acks: acks, tag: tag, span: span, done: make(chan struct{})}
	if err := c.submit(ctx, j, j.done); err != nil {
		if j.owner.CompareAndSwap(ownerNone, ownerWorker) {
			return "", false, sentAck{}, err // the committer will not ack it
		}
		<-j.done // the committer is acking it: a moment
	}
	return j.out, j.fresh, j.ack, j.err
}

// Who settles a committed job's delivery: its committer, unless the worker
// gave up waiting first (and settles or leaves it itself). A delivery settled
// twice would close the channel.
const (
	ownerNone int32 = iota
	ownerCommitter
	ownerWorker
)

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
	for _, j := range batch {
		j.commit = c.tracer.Commit(j.span, len(batch))
	}
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
			if j.fresh {
				j.hooks.committed()
			}
		}
		j.commit.Fail(j.err)
		j.commit.End()
	}
	c.ackCommitted(batch)
	for _, j := range batch {
		close(j.done)
	}
}

// ackCommitted acks the batch's committed messages, each session's with one
// multiple ack where their delivery tags allow (acks.go). A committer
// crash point between the commit and the ack (StageCommit) fires for each
// message before any is acked.
func (c *committer) ackCommitted(batch []*commitJob) {
	var sessions []*acker // nearly always one
	var tags []uint64
	for _, j := range batch {
		if j.err == nil && j.acks != nil && j.owner.CompareAndSwap(ownerNone, ownerCommitter) {
			c.stage(StageCommit)
			if !slices.Contains(sessions, j.acks) {
				sessions = append(sessions, j.acks)
			}
		}
	}
	for _, a := range sessions {
		tags = tags[:0]
		for _, j := range batch {
			if j.acks == a && j.owner.Load() == ownerCommitter {
				tags = append(tags, j.tag)
			}
		}
		spans := c.settleSpans(batch, a)
		err := a.ack(tags...)
		for _, j := range batch {
			if j.acks == a && j.owner.Load() == ownerCommitter {
				j.ack = sentAck{sent: true, err: err}
			}
		}
		for _, s := range spans {
			s.Fail(err)
			s.End()
		}
	}
}

// settleSpans starts the settle spans of the batch's jobs that a's one ack
// settles; none with tracing off.
func (c *committer) settleSpans(batch []*commitJob, a *acker) []tracing.Span {
	if c.tracer == nil {
		return nil
	}
	var spans []tracing.Span
	for _, j := range batch {
		if j.acks == a && j.owner.Load() == ownerCommitter {
			spans = append(spans, c.tracer.SettleOf(j.span, "ack", c.queue, j.tag))
		}
	}
	return spans
}

// apply runs a job's writes after its claim, keeping the outcome they report.
func (c *committer) apply(ctx context.Context, j *commitJob) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		c.stage(StageInboxInsert)
		j.out = ""
		if j.writes == nil {
			return nil
		}
		// The writes see the commit's span: an outbox row they add carries
		// its trace on.
		out, err := j.writes(tracing.ContextWith(j.hooks.run(ctx), j.commit), tx)
		j.out = out
		return err
	}
}
