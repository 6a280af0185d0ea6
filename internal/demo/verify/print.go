package verify

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Print writes the report as a table and the checks with PASS or FAIL.
func (r Report) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, v any) { fmt.Fprintf(tw, "%s\t%v\n", name, v) }
	row("runs", r.Runs)
	row("orders published", r.OrdersPublished)
	row("messages published", r.MessagesPublished)
	row("  duplicates sent (same id)", r.DuplicatesSent)
	row("  republishes sent (new id)", r.RepublishesSent)
	row("  poison sent", r.PoisonSent)
	row("payments", r.Payments)
	row("  declined", r.Declined)
	row("gateway charges", r.GatewayCharges)
	row("gateway replays served", r.GatewayReplays)
	row("duplicates suppressed", r.DuplicatesAbsorbed)
	dead := 0
	for _, n := range r.DeadLettered {
		dead += n
	}
	row("dead-lettered", dead)
	for _, reason := range sortedKeys(r.DeadLettered) {
		row("  "+reason, r.DeadLettered[reason])
	}
	for _, q := range sortedKeys(r.Queued) {
		row("still queued in "+q, r.Queued[q])
	}
	if p := r.Pipeline; p != nil {
		row("shipments", p.Shipments)
		row("declined orders (shipping)", p.Declined)
		row("carrier pickups", p.Pickups)
		row("outbox pending / parked", fmt.Sprintf("%d / %d", p.OutboxPending, p.OutboxParked))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, c := range r.Checks {
		verdict := "PASS"
		if !c.OK {
			verdict = "FAIL"
		}
		line := verdict + "  " + c.Name
		if !c.OK && c.Detail != "" {
			line += ": " + c.Detail
		}
		fmt.Fprintln(w, line)
	}
	verdict := "PASS: every invariant holds"
	if !r.OK {
		verdict = "FAIL: an invariant is broken"
	}
	_, err := fmt.Fprintln(w, verdict)
	return err
}
