// Package verify checks, after a run, the invariants the template promises:
// every published order paid exactly once or dead-lettered, no order charged
// twice, nothing lost, queues drained. It reads the payments database, the
// gateway database and the broker, and the publisher's summaries say what was
// sent. Modelled on the checkers of RabbitMQ's Jepsen suite: lost, duplicated,
// unexpected.
package verify

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// Run is what one publisher run sent, as its summary reports it.
type Run struct {
	RunID                     string `json:"run_id"`
	Orders                    int    `json:"orders"`
	Published                 int    `json:"published"`
	Duplicates                int    `json:"duplicates"`
	Republishes               int    `json:"republishes"`
	PoisonTotal               int    `json:"poison_total"`
	RepublishedAfterReconnect int    `json:"republished_after_reconnect"`
}

// orderIDs lists the valid orders of the run, as the publisher numbers them.
func (r Run) orderIDs() []string {
	ids := make([]string, r.Orders)
	for n := range r.Orders {
		ids[n] = fmt.Sprintf("%s-%d", r.RunID, n)
	}
	return ids
}

// Broker is what verify needs of RabbitMQ: queue depths and the dead letters.
type Broker interface {
	Depth(queue string) (int, error)
	DeadLetters(ctx context.Context) ([]DeadLetter, error)
}

// Sources are the stores verify reads.
type Sources struct {
	Payments *gorm.DB
	Gateway  *gorm.DB
	Broker   Broker
	Topology rabbit.Topology
	// Pipeline, if set, extends the checks downstream (see Pipeline).
	Pipeline *Pipeline
}

// Report is the outcome: the counts and the invariants.
type Report struct {
	Runs                []string        `json:"runs"`
	OrdersPublished     int             `json:"orders_published"`
	MessagesPublished   int             `json:"messages_published"`
	DuplicatesSent      int             `json:"duplicates_sent"`
	RepublishesSent     int             `json:"republishes_sent"`
	PoisonSent          int             `json:"poison_sent"`
	Payments            int             `json:"payments"`
	Declined            int             `json:"payments_declined"`
	GatewayCharges      int             `json:"gateway_charges"`
	GatewayReplays      int             `json:"gateway_replays_served"`
	DuplicatesAbsorbed  int             `json:"duplicates_suppressed"`
	DeadLettered        map[string]int  `json:"dead_lettered_by_reason"`
	Queued              map[string]int  `json:"messages_still_queued"`
	Lost                []string        `json:"lost_orders"`
	ChargedTwice        []string        `json:"orders_charged_twice"`
	PaidWithoutCharge   []string        `json:"payments_without_charge"`
	UnexpectedPayments  []string        `json:"unexpected_payments"`
	ChargesWithoutOrder []string        `json:"charges_without_payment_or_dead_letter"`
	Pipeline            *PipelineReport `json:"pipeline,omitempty"`
	Checks              []Check         `json:"checks"`
	OK                  bool            `json:"ok"`
}

// Check is one invariant.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Verify builds the report for runs.
func Verify(ctx context.Context, src Sources, runs []Run) (Report, error) {
	r := Report{DeadLettered: map[string]int{}, Queued: map[string]int{}}
	for _, run := range runs {
		r.Runs = append(r.Runs, run.RunID)
		r.OrdersPublished += run.Orders
		r.MessagesPublished += run.Published
		r.DuplicatesSent += run.Duplicates
		r.RepublishesSent += run.Republishes
		r.PoisonSent += run.PoisonTotal
	}
	f, err := collect(ctx, src, runs)
	if err != nil {
		return r, err
	}
	r.fill(f, runs)
	r.check()
	if src.Pipeline != nil {
		if err := r.checkPipeline(ctx, src, runs, f); err != nil {
			return r, err
		}
	}
	r.OK = true
	for _, c := range r.Checks {
		r.OK = r.OK && c.OK
	}
	return r, nil
}

// facts are the raw observations, keyed by order id.
type facts struct {
	paid    map[string]string // order → status
	charges map[string]int    // order → charge rows
	replays int
	dead    []DeadLetter
	queued  map[string]int
}

func (r *Report) fill(f facts, runs []Run) {
	published := map[string]bool{}
	for _, run := range runs {
		for _, id := range run.orderIDs() {
			published[id] = true
		}
	}
	deadOrders := map[string]bool{}
	validDead := 0
	for _, m := range f.dead {
		if !ofRuns(m, runs) {
			continue // another run's, or no run's: the queue is shared
		}
		r.DeadLettered[m.Reason]++
		deadOrders[m.Attrs["order_id"]] = true
		if published[m.Attrs["order_id"]] {
			validDead++
		}
	}
	for id, status := range f.paid {
		r.Payments++
		if status == "declined" {
			r.Declined++
		}
		if !published[id] {
			r.UnexpectedPayments = append(r.UnexpectedPayments, id)
		}
		if f.charges[id] == 0 {
			r.PaidWithoutCharge = append(r.PaidWithoutCharge, id)
		}
	}
	for id, n := range f.charges {
		r.GatewayCharges += n
		if n > 1 {
			r.ChargedTwice = append(r.ChargedTwice, id)
		}
		if f.paid[id] == "" && !deadOrders[id] {
			r.ChargesWithoutOrder = append(r.ChargesWithoutOrder, id)
		}
	}
	for id := range published {
		if f.paid[id] == "" && !deadOrders[id] {
			r.Lost = append(r.Lost, id)
		}
	}
	r.GatewayReplays = f.replays
	r.Queued = f.queued
	valid := r.MessagesPublished - r.PoisonSent
	for _, run := range runs {
		valid += run.RepublishedAfterReconnect
	}
	r.DuplicatesAbsorbed = valid - r.Payments - validDead
	for _, s := range [][]string{r.Lost, r.ChargedTwice, r.PaidWithoutCharge, r.UnexpectedPayments, r.ChargesWithoutOrder} {
		slices.Sort(s)
	}
}

// ofRuns reports whether a dead letter (or a parked message) is one of the
// runs' messages: an order of a run (<run id>-<n>, <run id>-poison-<i>, the
// order id of its log attributes) or one of its poison messages, whose
// message ids are poison-<run id>-<i>-<kind>.
func ofRuns(m DeadLetter, runs []Run) bool {
	for _, run := range runs {
		if strings.HasPrefix(m.ID, "poison-"+run.RunID+"-") || strings.HasPrefix(m.Attrs["order_id"], run.RunID+"-") {
			return true
		}
	}
	return false
}

func (r *Report) check() {
	queued := 0
	for _, n := range r.Queued {
		queued += n
	}
	r.Checks = []Check{
		{"nothing lost: every published order is paid or dead-lettered", len(r.Lost) == 0, ids(r.Lost)},
		{"no order charged twice", len(r.ChargedTwice) == 0, ids(r.ChargedTwice)},
		{"every payment has its gateway charge", len(r.PaidWithoutCharge) == 0, ids(r.PaidWithoutCharge)},
		{"no unexpected payment (poison or unknown order)", len(r.UnexpectedPayments) == 0, ids(r.UnexpectedPayments)},
		{"every charge has its payment or dead letter", len(r.ChargesWithoutOrder) == 0, ids(r.ChargesWithoutOrder)},
		{"queues drained", queued == 0, fmt.Sprint(r.Queued)},
	}
}

func ids(s []string) string {
	const show = 5
	if len(s) <= show {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s … (%d in all)", strings.Join(s[:show], ", "), len(s))
}

func collect(ctx context.Context, src Sources, runs []Run) (facts, error) {
	f := facts{paid: map[string]string{}, charges: map[string]int{}, queued: map[string]int{}}
	for _, run := range runs {
		if err := collectRun(ctx, src, likePrefix(run.RunID+"-"), &f); err != nil {
			return f, err
		}
	}
	var err error
	if f.dead, err = src.Broker.DeadLetters(ctx); err != nil {
		return f, fmt.Errorf("read dead letters: %w", err)
	}
	if err := collectBuffered(ctx, src, &f); err != nil {
		return f, err
	}
	t := src.Topology
	queues := []string{t.Queue}
	for _, d := range t.RetryDelays {
		queues = append(queues, t.RetryQueue(d))
	}
	for _, q := range queues {
		if f.queued[q], err = src.Broker.Depth(q); err != nil {
			return f, fmt.Errorf("read depth of %s: %w", q, err)
		}
	}
	return f, nil
}

// collectRun reads the payments and charges of the orders whose id matches the
// LIKE pattern of one run.
func collectRun(ctx context.Context, src Sources, pattern string, f *facts) error {
	var payments []struct{ OrderID, Status string }
	if err := src.Payments.WithContext(ctx).Table("payments").Select("order_id, status").
		Where(`order_id LIKE ? ESCAPE '\'`, pattern).Find(&payments).Error; err != nil {
		return fmt.Errorf("read payments: %w", err)
	}
	for _, p := range payments {
		f.paid[p.OrderID] = p.Status
	}
	var charges []struct {
		OrderID string
		N       int
		Replays int
	}
	if err := src.Gateway.WithContext(ctx).Table("charges").Select("order_id, count(*) AS n, sum(replays) AS replays").
		Where(`order_id LIKE ? ESCAPE '\' AND state = 'completed'`, pattern).Group("order_id").Find(&charges).Error; err != nil {
		return fmt.Errorf("read charges: %w", err)
	}
	for _, c := range charges {
		f.charges[c.OrderID] = c.N
		f.replays += c.Replays
	}
	return nil
}

// likePrefix is a LIKE pattern matching every string that starts with prefix,
// whose own % and _ are taken literally.
func likePrefix(prefix string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(prefix) + "%"
}

// sortedKeys returns m's keys in order, for stable printing.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
