package verify

import (
	"context"
	"encoding/json"
	"fmt"
)

// bufferedQueue names the buffered inbox's unprocessed messages among the
// queues that must be drained.
const bufferedQueue = "the buffered inbox (pending, processing or failed)"

// collectBuffered reads the buffered inbox, if the database has one: a
// parked message counts as dead-lettered (an operator decides about it; its
// reason is prefixed "parked: "), and a message still to process as queued.
func collectBuffered(ctx context.Context, src Sources, f *facts) error {
	var exists bool
	if err := src.Payments.WithContext(ctx).Raw(`SELECT to_regclass('inbox_messages') IS NOT NULL`).Row().Scan(&exists); err != nil {
		return fmt.Errorf("look for the buffered inbox: %w", err)
	}
	if !exists {
		return nil
	}
	var rows []struct {
		MessageID  string
		Status     string
		ParkReason *string
		Body       []byte
	}
	if err := src.Payments.WithContext(ctx).Raw(`SELECT message_id, status, park_reason, body FROM inbox_messages
		WHERE status IN ('pending', 'processing', 'failed', 'parked')`).Scan(&rows).Error; err != nil {
		return fmt.Errorf("read the buffered inbox: %w", err)
	}
	unprocessed := 0
	for _, r := range rows {
		if r.Status != "parked" {
			unprocessed++
			continue
		}
		reason := "parked"
		if r.ParkReason != nil {
			reason += ": " + *r.ParkReason
		}
		var body struct {
			OrderID string `json:"order_id"`
		}
		_ = json.Unmarshal(r.Body, &body) // poison has none
		f.dead = append(f.dead, DeadLetter{ID: r.MessageID, Reason: reason, Attrs: map[string]string{"order_id": body.OrderID}})
	}
	f.queued[bufferedQueue] = unprocessed
	return nil
}
