package deadletter

import (
	"context"
	"fmt"
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
	"github.com/inbox-template/payment-service/kit/rabbit"
	"github.com/inbox-template/payment-service/kit/wire"
)

// ExportReport says what an export did.
type ExportReport struct {
	Exported []buffered.Parked // in the dead-letter queue now (or, with a dry run, would be)
	Stale    int               // published, but retried or skipped meanwhile: one copy too many, a duplicate on replay
}

// maxExport bounds the parked messages one export moves.
const maxExport = 10_000

// Export moves the parked messages of the buffered inbox that sel chooses to
// the dead-letter queue, so that dlq list and dlq replay work on them as on
// any dead letter. Each copy carries the dead-letter headers of the runtime
// (the park reason, the last error, the attempts) and is published with a
// confirm; only then is the message marked dead_lettered, its key moved on
// and its inbox row deleted, so that a replay is stored again as a new
// message at the end of its key. A crash in between leaves the message parked
// and a copy in the queue: exporting again adds a second copy, and replaying
// both applies the message once (the second is a duplicate).
func (q *Queue) Export(ctx context.Context, store *buffered.Store, sel buffered.Selector, dryRun bool) (ExportReport, error) {
	var rep ExportReport
	if err := sel.Validate(); err != nil {
		return rep, err
	}
	parked, err := store.ListParked(ctx, sel, maxExport)
	if err != nil || dryRun {
		rep.Exported = parked
		return rep, err
	}
	pub, err := rabbit.NewPublisher(q.conn)
	if err != nil {
		return rep, err
	}
	defer pub.Close()
	for _, p := range parked {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		err := pub.Publish(pctx, q.topo.DeadLetterExchange, q.topo.DeadLetterKey(), exportCopy(p, store.Consumer()))
		cancel()
		if err != nil {
			return rep, fmt.Errorf("export message %q: %w", p.MessageID, err)
		}
		ok, err := store.MarkDeadLettered(ctx, p)
		if err != nil {
			return rep, fmt.Errorf("message %q is in the dead-letter queue but still parked (export it again, or skip it): %w", p.MessageID, err)
		}
		if !ok {
			rep.Stale++
			continue
		}
		rep.Exported = append(rep.Exported, p)
	}
	return rep, nil
}

// exportCopy is a parked message as the runtime would have dead-lettered it.
func exportCopy(p buffered.Parked, consumerName string) amqp.Publishing {
	h := maps.Clone(p.Headers)
	if h == nil {
		h = amqp.Table{}
	}

	h[wire.HeaderDeadLetterReason] = p.Reason
	h[wire.HeaderDeadLetterError] = p.LastError
	h[wire.HeaderDeadLetteredAt] = time.Now().UTC().Format(time.RFC3339Nano)
	h[wire.HeaderDeadLetterBy] = consumerName
	h[wire.HeaderAttempt] = int32(p.Attempts) // #nosec G115 -- at most BUFFER_MAX_ATTEMPTS (≤ 10000)
	// Every parked message was claimed, so it may have run: the copy, stored
	// again as a new message when replayed, must say so to the key-expiry
	// guard (its runs are not counted anew).
	h[wire.HeaderMayHaveRun] = true
	if _, ok := h[wire.HeaderFirstError]; !ok {
		h[wire.HeaderFirstError] = p.LastError
	}
	delete(h, "x-death")
	if _, ok := h[wire.HeaderTimestampMillis]; !ok && p.PublishedAt.IsZero() {
		// No publish time: its storing bounds its first run from below, and
		// the replayed copy is stored anew.
		h[wire.HeaderTimestampMillis] = p.ReceivedAt.UnixMilli()
	}
	// The publish time, for dlq replay's age limit; timestamp_in_ms, if the
	// producer set it, is among the stored headers.
	return amqp.Publishing{
		MessageId: p.MessageID, ContentType: p.ContentType, DeliveryMode: amqp.Persistent, Headers: h, Body: p.Body,
		Timestamp: p.PublishedAt,
	}
}
