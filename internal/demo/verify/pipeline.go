package verify

import (
	"context"
	"fmt"
	"slices"

	"gorm.io/gorm"
)

// Pipeline is the rest of the demo pipeline, checked when given: the
// shipping service's database (its shipments, and its declined orders: its
// second event) and the fake carrier's (its pickups). The payment service's outbox is read from Sources.Payments.
type Pipeline struct {
	Shipping *gorm.DB
	Carrier  *gorm.DB
	Producer string // the payment service's outbox rows: its consumer name
}

// PipelineReport is what verify finds downstream of the payments.
type PipelineReport struct {
	Shipments          int      `json:"shipments"`
	Declined           int      `json:"declined_orders"`
	Pickups            int      `json:"pickups"`
	OutboxPending      int      `json:"outbox_pending"`
	OutboxParked       int      `json:"outbox_parked"`
	PaidNotShipped     []string `json:"paid_orders_not_shipped"`
	ShippedNotPaid     []string `json:"shipments_without_a_succeeded_payment"`
	PickedUpTwice      []string `json:"orders_picked_up_twice"`
	ShippedWithoutPick []string `json:"shipments_without_a_pickup"`
	DeclinedNotSeen    []string `json:"declined_payments_not_recorded_by_shipping"`
	DeclinedNotThat    []string `json:"declined_orders_without_a_declined_payment"`
}

// checkPipeline reads the pipeline's stores for the runs' orders and adds
// its invariants to r: every succeeded payment has exactly one shipment and
// one pickup, no declined order has one, every declined payment reached the
// shipping service once (its second event, PaymentDeclined) and nothing
// else is recorded there as declined, no pickup is booked twice, the outbox
// is drained.
func (r *Report) checkPipeline(ctx context.Context, src Sources, runs []Run, f facts) error {
	p := &PipelineReport{}
	r.Pipeline = p
	shipped := map[string]int{}
	picked := map[string]int{}
	declined := map[string]int{}
	for _, run := range runs {
		pattern := likePrefix(run.RunID + "-")
		var rows []struct {
			OrderID string
			N       int
		}
		if err := src.Pipeline.Shipping.WithContext(ctx).Table("shipments").Select("order_id, count(*) AS n").
			Where(`order_id LIKE ? ESCAPE '\'`, pattern).Group("order_id").Find(&rows).Error; err != nil {
			return fmt.Errorf("read shipments: %w", err)
		}
		for _, s := range rows {
			shipped[s.OrderID] += s.N
		}
		rows = nil
		if err := src.Pipeline.Shipping.WithContext(ctx).Table("declined_orders").Select("order_id, count(*) AS n").
			Where(`order_id LIKE ? ESCAPE '\'`, pattern).Group("order_id").Find(&rows).Error; err != nil {
			return fmt.Errorf("read declined orders: %w", err)
		}
		for _, s := range rows {
			declined[s.OrderID] += s.N
		}
		rows = nil
		if err := src.Pipeline.Carrier.WithContext(ctx).Table("pickups").Select("order_id, count(*) AS n").
			Where(`order_id LIKE ? ESCAPE '\' AND state = 'completed'`, pattern).Group("order_id").Find(&rows).Error; err != nil {
			return fmt.Errorf("read pickups: %w", err)
		}
		for _, s := range rows {
			picked[s.OrderID] += s.N
		}
	}
	for id, status := range f.paid {
		if status == "succeeded" && shipped[id] != 1 {
			p.PaidNotShipped = append(p.PaidNotShipped, id)
		}
		if status == "declined" && declined[id] != 1 {
			p.DeclinedNotSeen = append(p.DeclinedNotSeen, id)
		}
	}
	for id, n := range declined {
		p.Declined += n
		if f.paid[id] != "declined" {
			p.DeclinedNotThat = append(p.DeclinedNotThat, id)
		}
	}
	for id, n := range shipped {
		p.Shipments += n
		if f.paid[id] != "succeeded" {
			p.ShippedNotPaid = append(p.ShippedNotPaid, id)
		}
		if picked[id] == 0 {
			p.ShippedWithoutPick = append(p.ShippedWithoutPick, id)
		}
	}
	for id, n := range picked {
		p.Pickups += n
		if n > 1 {
			p.PickedUpTwice = append(p.PickedUpTwice, id)
		}
	}
	if err := src.Payments.WithContext(ctx).Raw(`SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'parked')
		FROM outbox WHERE producer = ?`, src.Pipeline.Producer).Row().Scan(&p.OutboxPending, &p.OutboxParked); err != nil {
		return fmt.Errorf("read the outbox: %w", err)
	}
	for _, s := range [][]string{p.PaidNotShipped, p.ShippedNotPaid, p.PickedUpTwice, p.ShippedWithoutPick, p.DeclinedNotSeen, p.DeclinedNotThat} {
		slices.Sort(s)
	}
	r.Checks = append(r.Checks,
		Check{"pipeline: every succeeded payment has exactly one shipment", len(p.PaidNotShipped) == 0, ids(p.PaidNotShipped)},
		Check{"pipeline: no shipment without a succeeded payment (none for a decline)", len(p.ShippedNotPaid) == 0, ids(p.ShippedNotPaid)},
		Check{"pipeline: no pickup booked twice", len(p.PickedUpTwice) == 0, ids(p.PickedUpTwice)},
		Check{"pipeline: every shipment has its pickup", len(p.ShippedWithoutPick) == 0, ids(p.ShippedWithoutPick)},
		Check{"pipeline: every declined payment reached the shipping service once (PaymentDeclined)", len(p.DeclinedNotSeen) == 0, ids(p.DeclinedNotSeen)},
		Check{"pipeline: no order recorded declined by the shipping service without a declined payment", len(p.DeclinedNotThat) == 0, ids(p.DeclinedNotThat)},
		Check{"pipeline: the payment service's outbox is drained (nothing pending or parked)", p.OutboxPending+p.OutboxParked == 0,
			fmt.Sprintf("%d pending, %d parked", p.OutboxPending, p.OutboxParked)},
	)
	return nil
}
