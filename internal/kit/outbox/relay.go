package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/internal/kit/consumer"
	"github.com/inbox-template/payment-service/internal/kit/database"
	"github.com/inbox-template/payment-service/internal/kit/rabbit"
	"github.com/inbox-template/payment-service/internal/kit/tracing"
)

// RelayConfig tunes a Relay. Zero values are replaced by the defaults.
type RelayConfig struct {
	AMQPURL   string
	Heartbeat time.Duration
	Name      string // the connection's name in the management UI
	// Exchanges are declared (topic, durable) at every connect: the
	// exchanges the service publishes to.
	Exchanges []string
	// Batch bounds the rows one claim leases and publishes together.
	Batch int
	// PollInterval is the floor of the wake-ups: besides its own process's
	// commits and the other replicas' NOTIFY, the relay looks this often.
	PollInterval time.Duration
	// Lease is how long a claim holds its rows before another relay may
	// take them over (their holder is presumed dead): above the publish
	// timeout, so that two relays never publish one row at the same time.
	Lease time.Duration
	// RetryDelays and MaxAttempts are a row's retries after a failed
	// publish (no queue bound, refused by the broker): the delay before
	// attempt n+1 (the last repeating), and the attempts before it is parked.
	RetryDelays []time.Duration
	MaxAttempts int
	// ListenURL is the database the LISTEN connection dials; "" relies on the
	// process's own wake-ups and the poll.
	ListenURL string
	// ReconnectMaxWait caps the backoff after the broker or the database failed.
	ReconnectMaxWait time.Duration
	// OnPublished, if set, runs after a batch is confirmed by the broker and
	// before it is marked sent: the crash point after-outbox-publish.
	OnPublished func()
}

func (c *RelayConfig) setDefaults() {
	if c.Heartbeat == 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.Batch == 0 {
		c.Batch = 100
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if len(c.RetryDelays) == 0 {
		c.RetryDelays = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 5 * time.Minute}
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 20
	}
	if c.ReconnectMaxWait == 0 {
		c.ReconnectMaxWait = 30 * time.Second
	}
}

// publishTimeout bounds one batch's publishes and their confirms; the lease
// must outlast it.
const publishTimeout = 15 * time.Second

// Park reasons.
const (
	ReasonUnroutable = "unroutable" // no queue is bound for it (a mandatory publish returned)
	ReasonRefused    = "refused"    // the broker nacked it
)

// notifyEvery throttles the relay's NOTIFY to the other replicas.
const notifyEvery = 50 * time.Millisecond

// Relay publishes one producer's committed outbox rows. Every replica runs
// one; their claims never take the same row at the same time.
type Relay struct {
	cfg     RelayConfig
	nodes   *rabbit.Nodes // the broker's nodes (AMQP_URL)
	node    string        // the last session's node; Run's goroutine only
	store   *Store
	outbox  *Outbox
	metrics *Metrics
	log     *slog.Logger
	notify  chan struct{} // tell the other replicas
	remote  chan struct{} // another replica committed rows (NOTIFY)
	// state for readiness: "" while connected, else why not.
	state atomic.Pointer[string]
}

// NewRelay returns the relay of ob's rows in store.
func NewRelay(cfg RelayConfig, store *Store, ob *Outbox, m *Metrics, log *slog.Logger) (*Relay, error) {
	cfg.setDefaults()
	switch {
	case cfg.AMQPURL == "":
		return nil, errors.New("outbox relay: AMQP URL is empty")
	case cfg.Lease <= publishTimeout:
		return nil, fmt.Errorf("outbox relay: lease %s must exceed the publish timeout %s", cfg.Lease, publishTimeout)
	case cfg.Batch < 1 || cfg.MaxAttempts < 1:
		return nil, fmt.Errorf("outbox relay: batch %d and max attempts %d must be at least 1", cfg.Batch, cfg.MaxAttempts)
	}
	nodes, err := rabbit.ParseNodes(cfg.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("outbox relay: AMQP URL: %w", err)
	}
	r := &Relay{cfg: cfg, nodes: nodes, store: store, outbox: ob, metrics: m, log: log.With("component", "outbox relay"),
		notify: make(chan struct{}, 1), remote: make(chan struct{}, 1)}
	r.setState("starting")
	return r, nil
}

func (r *Relay) setState(s string) { r.state.Store(&s) }

// Ready reports nil while the relay is connected to the broker. A backlog
// alone never fails it.
func (r *Relay) Ready() error {
	if s := *r.state.Load(); s != "" {
		return errors.New(s)
	}
	return nil
}

// Run publishes until ctx ends. A batch in flight then is given its publish
// timeout to be confirmed and marked: a row published and not marked is
// published again by the next relay, with the same id.
func (r *Relay) Run(ctx context.Context) error {
	var helpers sync.WaitGroup
	defer helpers.Wait()
	hctx, stopHelpers := context.WithCancel(ctx)
	defer stopHelpers()
	channel := database.Channel("outbox", r.store.Producer())
	if r.cfg.ListenURL != "" {
		// A NOTIFY wakes the relay without sending one in turn (its own comes
		// back to it too).
		helpers.Go(func() {
			database.Listen(hctx, r.cfg.ListenURL, r.cfg.Name+" listen", channel, func() { signal(r.remote) }, r.log)
		})
	}
	helpers.Go(func() {
		database.NotifyThrottled(hctx, r.notify, notifyEvery, func(ctx context.Context) error {
			_, err := r.store.db.ExecContext(ctx, `SELECT pg_notify($1, '')`, channel)
			return err
		}, r.log)
	})
	helpers.Go(func() { r.refreshGauges(hctx) })
	r.log.Info("relaying the outbox", "producer", r.store.Producer(), "batch", r.cfg.Batch, "poll", r.cfg.PollInterval.String())
	wait := 200 * time.Millisecond
	for {
		started := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
			r.setState("stopped")
			return nil
		}
		if time.Since(started) > time.Minute {
			wait = 200 * time.Millisecond
		}
		d := wait/2 + rand.N(wait/2+1)
		wait = min(2*wait, r.cfg.ReconnectMaxWait)
		r.setState("outbox relay not connected to the broker: " + err.Error())
		r.metrics.reconnects.WithLabelValues(r.store.Producer()).Inc()
		r.log.Warn("outbox relay session ended; reconnecting (nothing is lost: unsent rows wait in the table)", "err", err, "wait", d.String())
		if !sleep(ctx, d) {
			r.setState("stopped")
			return nil
		}
	}
}

// link is one broker session of the relay.
type link struct {
	conn       *amqp.Connection
	node       string // host:port
	ch         *amqp.Channel
	returns    chan amqp.Return
	connClosed chan *amqp.Error
	chClosed   chan *amqp.Error
	// unblocked is closed when the broker unblocks the connection; nil while
	// it is not blocked.
	mu        sync.Mutex
	unblocked chan struct{}
}

func (r *Relay) dial() (*link, error) {
	conn, node, err := r.nodes.Dial(r.cfg.Heartbeat, r.cfg.Name+" outbox")
	if err != nil {
		return nil, err
	}
	ch, err := rabbit.ConfirmChannel(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	for _, ex := range r.cfg.Exchanges {
		if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("declare exchange %s: %w", ex, err)
		}
	}
	l := &link{conn: conn, node: node, ch: ch,
		// Room for a whole batch: the library's reader never waits on it.
		returns:    ch.NotifyReturn(make(chan amqp.Return, r.cfg.Batch)),
		connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		chClosed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
	// Buffered, and drained until the library closes it with the connection.
	go l.watchBlocked(conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
	return l, nil
}

func (l *link) watchBlocked(blocked <-chan amqp.Blocking) {
	for b := range blocked {
		l.mu.Lock()
		switch {
		case b.Active && l.unblocked == nil:
			l.unblocked = make(chan struct{})
		case !b.Active && l.unblocked != nil:
			close(l.unblocked)
			l.unblocked = nil
		}
		l.mu.Unlock()
	}
}

func (l *link) blockedUntil() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unblocked
}

func (l *link) close() {
	_ = l.conn.CloseDeadline(time.Now().Add(2 * time.Second))
}

// session publishes over one broker connection until it fails or ctx ends.
func (r *Relay) session(ctx context.Context) error {
	l, err := r.dial()
	if err != nil {
		return err
	}
	defer l.close()
	defer func() {
		if l.conn.IsClosed() { // lost before the deferred close: a node gone, a cut
			r.nodes.Lost(l.node)
		}
	}()
	r.setState("")
	r.log.Info("outbox relay connected", "node", l.node, "exchanges", r.cfg.Exchanges)
	if r.node != "" && l.node != r.node {
		r.metrics.failovers.WithLabelValues(r.store.Producer()).Inc()
		r.log.Warn("broker failover: the outbox relay's session is on another node", "from", r.node, "to", l.node, "nodes", r.nodes.String())
	}
	r.node = l.node
	dbWait := time.Second
	for {
		if ch := l.blockedUntil(); ch != nil {
			r.setState("the broker blocks publishing (resource alarm)")
			select {
			case <-ch:
				r.setState("")
			case e := <-l.connClosed:
				return fmt.Errorf("connection closed: %v", e)
			case e := <-l.chClosed:
				return fmt.Errorf("channel closed: %v", e)
			case <-ctx.Done():
				return nil
			}
		}
		claimed, token, err := r.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Error("claiming outbox rows failed (the database?); trying again", "err", err, "wait", dbWait.String())
			if !sleep(ctx, dbWait) {
				return nil
			}
			dbWait = min(2*dbWait, r.cfg.ReconnectMaxWait)
			continue
		}
		dbWait = time.Second
		if len(claimed) > 0 {
			if err := r.publish(ctx, l, token, claimed); err != nil {
				return err
			}
			// More may be due: the rest of a full batch, or the successors
			// of the ordered rows just marked sent.
			continue
		}
		select {
		case <-r.outbox.wake: // this process committed rows: tell the others
			signal(r.notify)
		case <-r.remote:
		case <-time.After(r.cfg.PollInterval):
		case e := <-l.connClosed:
			return fmt.Errorf("connection closed: %v", e)
		case e := <-l.chClosed:
			return fmt.Errorf("channel closed: %v", e)
		case <-ctx.Done():
			return nil
		}
	}
}

// signal sends on a wake-up channel of room one, never blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (r *Relay) claim(ctx context.Context) ([]Claimed, int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return r.store.Claim(cctx, r.cfg.Batch, r.cfg.Lease)
}

// publish sends a claimed batch with confirms, then settles each row: sent
// once confirmed (and taken by a queue, if mandatory), failed with a retry
// time or parked if returned or refused, released if the link failed before
// its confirm. It returns an error when the link is gone.
func (r *Relay) publish(ctx context.Context, l *link, token int64, batch []Claimed) error {
	// Detached from the stop: a batch that began is confirmed and marked.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	began := time.Now()
	confirms := make([]*amqp.DeferredConfirmation, len(batch))
	spans := r.spans(len(batch))
	defer r.endSpans(spans)
	var linkErr error
	for i, c := range batch {
		msg := publishing(c)
		if spans != nil {
			// A child of the transaction that wrote the row, whose context its headers carry.
			_, spans[i] = r.outbox.tracer.Publish(r.outbox.tracer.Extract(pctx, c.Headers), c.Exchange, c.RoutingKey, &msg)
		}
		dc, err := l.ch.PublishWithDeferredConfirmWithContext(pctx, c.Exchange, c.RoutingKey, c.Mandatory, false, msg)
		if err != nil {
			linkErr = fmt.Errorf("publish outbox row %s: %w", c.ID, err)
			break
		}
		confirms[i] = dc
	}
	var sent []Claimed
	pending := map[int]bool{} // no confirm: the link failed first
	refused := map[int]string{}
	for i, dc := range confirms {
		if dc == nil {
			pending[i] = true
			continue
		}
		acked, err := dc.WaitContext(pctx)
		switch {
		case err != nil:
			if linkErr == nil {
				linkErr = fmt.Errorf("confirm of outbox row %s: %w", batch[i].ID, err)
			}
			pending[i] = true
		case !acked:
			refused[i] = "the broker refused it (basic.nack)"
		default:
			sent = append(sent, batch[i])
		}
	}
	if l.ch.IsClosed() {
		linkErr = r.closedOn(l, batch, pending, refused, linkErr)
	}
	var unconfirmed []Claimed
	for i := range pending {
		unconfirmed = append(unconfirmed, batch[i])
	}
	// The broker sends the return of a mandatory publish before its confirm:
	// every return of the confirmed ones is in the channel now.
	returned := map[string]amqp.Return{}
	for more := true; more; {
		select {
		case ret, ok := <-l.returns:
			if !ok { // the library closed it with the channel
				more = false
				break
			}
			returned[ret.MessageId] = ret
		default:
			more = false
		}
	}
	if r.cfg.OnPublished != nil && len(sent) > 0 {
		r.cfg.OnPublished()
	}
	var taken []Claimed
	for _, c := range sent {
		if _, ok := returned[c.ID]; !ok {
			taken = append(taken, c)
		}
	}
	r.metrics.publishSeconds.WithLabelValues(r.store.Producer()).Observe(time.Since(began).Seconds())
	r.settle(token, batch, taken, unconfirmed, refused, returned)
	for i, s := range spans {
		switch ret, ok := returned[batch[i].ID]; {
		case pending[i]:
			s.Fail(errors.New("no confirm: the link failed first; the row goes back"))
		case refused[i] != "":
			s.Fail(errors.New(refused[i]))
		case ok:
			s.Fail(fmt.Errorf("%w (%d %s)", rabbit.ErrReturned, ret.ReplyCode, ret.ReplyText))
		}
	}
	return linkErr
}

// spans are the producer spans of a batch's publishes, nil with tracing off.
func (r *Relay) spans(n int) []tracing.Span {
	if r.outbox.tracer == nil {
		return nil
	}
	return make([]tracing.Span, n)
}

func (r *Relay) endSpans(spans []tracing.Span) {
	for _, s := range spans {
		s.End()
	}
}

// closedOn sorts out a batch whose channel closed before every confirm came:
// the library resolves the pending confirms as nacks, but those rows were not
// refused, their link failed, and they go back without an attempt. Except
// when the broker closed the channel on a publish of the batch itself (an
// exchange that does not exist, 404; no permission, 403; a message over the
// size limit, 406): then the first row left without a confirm is the one it
// refused, and it spends an attempt, so that it is parked in the end instead
// of closing the channel at every try while the rows behind it wait.
func (r *Relay) closedOn(l *link, batch []Claimed, pending map[int]bool, refused map[int]string, linkErr error) error {
	for i := range refused {
		pending[i] = true
		delete(refused, i)
	}
	var closeErr *amqp.Error
	select {
	case closeErr = <-l.chClosed:
	default:
	}
	if closeErr == nil || !closeErr.Server || closeErr.Code == amqp.ConnectionForced {
		if linkErr == nil {
			linkErr = errors.New("the channel closed before every confirm came")
		}
		return linkErr
	}
	first := -1
	for i := range pending {
		if first < 0 || i < first {
			first = i
		}
	}
	if first >= 0 {
		delete(pending, first)
		refused[first] = fmt.Sprintf("the broker closed the channel on it: %d %s", closeErr.Code, closeErr.Reason)
	}
	return fmt.Errorf("channel closed by the broker on a publish of outbox row %s: %w", batch[max(first, 0)].ID, closeErr)
}

// settle records what became of a batch, detached from shutdown.
func (r *Relay) settle(token int64, batch, taken, unconfirmed []Claimed, refused map[int]string, returned map[string]amqp.Return) {
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p := r.store.Producer()
	if n, err := r.markSent(sctx, token, taken); err != nil {
		r.log.Error("rows confirmed by the broker but not marked sent: they will be published again, with the same ids, once their lease ends",
			"rows", len(taken), "err", err)
	} else {
		r.metrics.published.WithLabelValues(p).Add(float64(n))
	}
	if err := r.store.Release(sctx, token, unconfirmed, 0); err != nil {
		r.log.Error("could not release unconfirmed rows; their lease ends by itself", "rows", len(unconfirmed), "err", err)
	}
	for i, c := range batch {
		reason, cause := "", ""
		if ret, ok := returned[c.ID]; ok {
			reason, cause = ReasonUnroutable, fmt.Sprintf("returned by the broker: %d %s (no queue is bound to %s with key %s)",
				ret.ReplyCode, ret.ReplyText, c.Exchange, c.RoutingKey)
		} else if why, ok := refused[i]; ok {
			reason, cause = ReasonRefused, why
		} else {
			continue
		}
		r.fail(sctx, token, c, reason, cause)
	}
}

// markSent marks the confirmed rows, trying again at once when the
// database broke a deadlock against it or a lock wait timed out: a
// transaction that emits to several ordering keys in separate Enqueue calls
// locks them in the order of its calls, the mark in key order, and
// PostgreSQL ends such a cycle by aborting one side. Given up, the rows are
// published again once their lease ends.
func (r *Relay) markSent(ctx context.Context, token int64, rows []Claimed) (int, error) {
	for try := 1; ; try++ {
		n, err := r.store.MarkSent(ctx, token, rows)
		var pg *pgconn.PgError
		if err == nil || try == 5 || !errors.As(err, &pg) || (pg.Code != "40P01" && pg.Code != "55P03") {
			return n, err
		}
		r.log.Warn("marking rows sent lost a deadlock or a lock wait; marking them again", "rows", len(rows), "try", try, "err", err)
		if !sleep(ctx, time.Duration(try)*20*time.Millisecond) {
			return 0, err
		}
	}
}

func (r *Relay) fail(ctx context.Context, token int64, c Claimed, reason, cause string) {
	delay := r.cfg.RetryDelays[min(c.Attempts, len(r.cfg.RetryDelays)-1)]
	parked, err := r.store.Fail(ctx, token, c, delay, r.cfg.MaxAttempts, reason, cause)
	log := r.log.With("outbox_id", c.ID, "exchange", c.Exchange, "routing_key", c.RoutingKey, "ordering_key", c.OrderingKey,
		"attempt", c.Attempts+1, "reason", reason)
	switch {
	case err != nil:
		log.Error("could not record a failed publish; the lease ends by itself", "err", err, "cause", cause)
	case parked:
		r.metrics.failures.WithLabelValues(r.store.Producer(), reason).Inc()
		log.Error("outbox row parked: it waits for an operator (outbox parked, outbox retry); its key's later rows wait behind it", "cause", cause)
	default:
		r.metrics.failures.WithLabelValues(r.store.Producer(), reason).Inc()
		log.Warn("outbox publish failed; retry scheduled", "delay", delay.String(), "cause", cause)
	}
}

// publishing is a row as it goes to the broker: its id as the message_id,
// persistent, with its creation as the publish time (for the next
// consumer's key-expiry guard) unless the handler set one.
func publishing(c Claimed) amqp.Publishing {
	h := c.Headers
	if h == nil {
		h = amqp.Table{}
	}
	if _, ok := h[consumer.HeaderTimestampMillis]; !ok {
		h[consumer.HeaderTimestampMillis] = c.CreatedAt.UnixMilli()
	}
	return amqp.Publishing{
		MessageId: c.ID, ContentType: c.ContentType, DeliveryMode: amqp.Persistent,
		Headers: h, Body: c.Body, Timestamp: c.CreatedAt,
	}
}

// refreshGauges reads the pending and parked counts and the oldest pending
// age from the table every few seconds.
func (r *Relay) refreshGauges(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := r.store.Status(qctx)
		cancel()
		if err == nil {
			r.metrics.set(r.store.Producer(), st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
