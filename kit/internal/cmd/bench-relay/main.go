// Command bench-relay is the kit's outbox relay alone, for the bench's relay
// configuration (bench/cmd/bench): the payment service's relay without the
// service around it. It is part of the kit's module, as the relay it drives
// is internal to the kit; the payment service's names and its OrderPaid are
// written out here (the kit imports no service): what the bench measures is
// the relay, on rows of the size and shape the service writes.
//
//	bench-relay fill -database-url URL -rows N   commit N OrderPaid rows through outbox.Enqueue
//	bench-relay relay -database-url URL -amqp-url URL   relay them until SIGTERM
//
// fill applies the kit's outbox schema (migrations.Outbox) and commits the
// rows as the payment service's handler writes them: one OrderPaid per order,
// to the payments exchange with the routing key order.paid, the order as the
// ordering key, in transactions of -tx-rows. relay runs outbox.NewRelay with
// the service's defaults (OUTBOX_BATCH 100, the poll, the lease, the
// retries) and the service's producer name, until SIGTERM.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/logging"
	"github.com/inbox-template/payment-service/kit/migrations"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-relay:", err)
		os.Exit(1)
	}
}

type options struct {
	mode                 string // fill or relay
	databaseURL, amqpURL string
	rows, txRows         int
	run                  string // order ids are <run>-<n>
	batch                int    // 0: the service's default
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	if len(args) == 0 || (args[0] != "fill" && args[0] != "relay") {
		return o, errors.New("usage: bench-relay fill|relay [flags]")
	}
	o.mode = args[0]
	fs := flag.NewFlagSet("bench-relay "+o.mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.databaseURL, "database-url", "", "the producer's database")
	fs.StringVar(&o.amqpURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL (relay)")
	fs.IntVar(&o.rows, "rows", 100000, "rows to commit (fill)")
	fs.IntVar(&o.txRows, "tx-rows", 500, "rows per transaction (fill)")
	fs.StringVar(&o.run, "run", "bench", "order ids are <run>-<n> (fill)")
	fs.IntVar(&o.batch, "batch", 0, "OUTBOX_BATCH of the relay (0: the service's default)")
	if err := fs.Parse(args[1:]); err != nil {
		return o, err
	}
	if o.databaseURL == "" || o.rows < 1 || o.txRows < 1 || o.batch < 0 {
		return o, errors.New("need -database-url, -rows ≥ 1, -tx-rows ≥ 1 and -batch ≥ 0")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := logging.New(stderr, "info", "bench-relay")
	// The pool of the service's relay is the service's main pool: at its
	// defaults (DB_MAX_CONNS 10) 8 connections, of which the relay takes
	// a few at moments (a claim and a mark, the gauges, a NOTIFY).
	db, err := database.Open(ctx, database.Options{
		URL: o.databaseURL, MaxConns: 8, StatementTimeout: 5 * time.Second, AppName: "bench-relay",
	}, log)
	if err != nil {
		return err
	}
	defer database.Close(db)
	if o.mode == "fill" {
		return fill(ctx, db, o, log)
	}
	return relay(ctx, db, o, log)
}

// The payment service's names, as its outbox rows carry them: the producer
// (its CONSUMER_NAME defaults to its name), the exchange its events go to,
// and OrderPaid's routing key (internal/payment/events.go). The payment
// service's TestBenchRelayWritesThePaymentServicesRows holds these and
// orderPaidEvent to its own.
const (
	producer         = "payment-service"
	exchangePayments = "payments"
	keyOrderPaid     = "order.paid"
)

// orderPaidEvent is the payment service's OrderPaid, as its JSON goes out.
type orderPaidEvent struct {
	EventID     string    `json:"event_id"`
	OrderID     string    `json:"order_id"`
	CustomerID  string    `json:"customer_id"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	ChargeID    string    `json:"charge_id"`
	Address     string    `json:"address,omitempty"`
	PaidAt      time.Time `json:"paid_at"`
}

// fill commits o.rows OrderPaid rows, o.txRows to a transaction, each
// transaction one Enqueue call as a handler's transaction of its own makes
// it (inserted at once, one statement).
func fill(ctx context.Context, db *gorm.DB, o options, log *slog.Logger) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	if _, err := migrations.Apply(ctx, sqlDB, migrations.Outbox); err != nil {
		return err
	}
	ob := outbox.New(producer, exchangePayments)
	started := time.Now()
	for first := 0; first < o.rows; first += o.txRows {
		msgs, err := orderPaid(o.run, first, min(o.txRows, o.rows-first))
		if err != nil {
			return err
		}
		err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			_, err := ob.Enqueue(ctx, tx, msgs...)
			return err
		})
		if err != nil {
			return fmt.Errorf("commit rows %d to %d: %w", first, first+len(msgs)-1, err)
		}
	}
	log.Info("outbox filled", "rows", o.rows, "rows_per_tx", o.txRows, "seconds", time.Since(started).Seconds())
	return nil
}

// orderPaid makes the events of orders first … first+n-1 as the payment
// service emits them (internal/payment/events.go).
func orderPaid(run string, first, n int) ([]outbox.Message, error) {
	msgs := make([]outbox.Message, 0, n)
	for i := first; i < first+n; i++ {
		id := fmt.Sprintf("%s-%d", run, i)
		charge := make([]byte, 12)
		_, _ = rand.Read(charge) // never fails (crypto/rand)
		body, err := json.Marshal(orderPaidEvent{
			EventID: "order-paid:" + id, OrderID: id, CustomerID: fmt.Sprintf("cus-%d", 1+i%1000),
			AmountCents: int64(100 + i*7919%99900), Currency: "EUR", ChargeID: "ch_" + hex.EncodeToString(charge),
			Address: fmt.Sprintf("%d Bench Street, Berlin", i+1), PaidAt: time.Now().UTC(),
		})
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, outbox.Message{
			Exchange: exchangePayments, RoutingKey: keyOrderPaid, Body: body, OrderingKey: id,
		})
	}
	return msgs, nil
}

// relay runs the relay as the kit's service wires it (service.newOutbox),
// with the configuration's defaults, until ctx ends.
func relay(ctx context.Context, db *gorm.DB, o options, log *slog.Logger) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	ob := outbox.New(producer, exchangePayments)
	r, err := outbox.NewRelay(outbox.RelayConfig{
		AMQPURL:   o.amqpURL,
		Name:      "bench-relay",
		Exchanges: []string{exchangePayments},
		Batch:     o.batch,
		ListenURL: o.databaseURL,
	}, outbox.NewStore(sqlDB, producer), ob, outbox.NewMetrics(prometheus.NewRegistry()), log)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
