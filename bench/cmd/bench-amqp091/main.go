// Command bench-amqp091 is the bench's plain consumer: amqp091-go, N workers
// on one channel with a prefetch, manual acks, each message's inbox claim and
// payment insert in one pgx transaction, acked after the commit. No gateway
// call, no retries, no dead-lettering: the floor a consumer with the
// transactional inbox can reach with the same transaction.
//
// On SIGTERM it stops consuming, finishes the messages in hand, and writes one
// publish→commit sample per message to -samples.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/bench/internal/broker"
	"github.com/inbox-template/payment-service/bench/internal/inboxtx"
	"github.com/inbox-template/payment-service/bench/internal/latency"
	"github.com/inbox-template/payment-service/bench/internal/load"
)

const consumerName = "bench-amqp091"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-amqp091:", err)
		os.Exit(1)
	}
}

type options struct {
	amqpURL, databaseURL, samplesPath string
	workers, prefetch                 int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench-amqp091", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.amqpURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL (its vhost holds the work queue)")
	fs.StringVar(&o.databaseURL, "database-url", "", "payments database, migrated by inboxctl migrate")
	fs.StringVar(&o.samplesPath, "samples", "", "write publish→commit samples here at exit")
	fs.IntVar(&o.workers, "workers", 8, "concurrent handlers; also the pool size")
	fs.IntVar(&o.prefetch, "prefetch", 200, "unacked deliveries held at most")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.databaseURL == "" || o.workers < 1 || o.prefetch < o.workers {
		return o, errors.New("need -database-url, -workers ≥ 1 and -prefetch ≥ -workers")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	pool, err := inboxtx.Open(ctx, o.databaseURL, consumerName, o.workers)
	if err != nil {
		return err
	}
	defer pool.Close()
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		return fmt.Errorf("connect to the broker: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	var rec latency.Recorder
	if err := consume(ctx, ch, pool, o, &rec, log); err != nil {
		return err
	}
	if o.samplesPath == "" {
		return nil
	}
	return rec.WriteFile(o.samplesPath)
}

// consume runs the workers until ctx ends, then cancels the consumer and waits
// for the messages in hand: the shutdown order of amqp091-go's doc.go.
func consume(ctx context.Context, ch *amqp.Channel, pool *pgxpool.Pool, o options, rec *latency.Recorder, log *slog.Logger) error {
	if err := ch.Qos(o.prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	if _, err := ch.QueueDeclare(broker.Queue, true, false, false, false, broker.QueueArgs()); err != nil {
		return fmt.Errorf("declare queue: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(broker.Queue, consumerName, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	log.Info("consuming", "queue", broker.Queue, "workers", o.workers, "prefetch", o.prefetch)
	var wg sync.WaitGroup
	for range o.workers {
		wg.Go(func() {
			for d := range deliveries {
				handle(context.WithoutCancel(ctx), pool, d, rec, log)
			}
		})
	}
	select {
	case <-ctx.Done():
	case err := <-closed:
		wg.Wait()
		return fmt.Errorf("channel closed: %v", err)
	}
	if err := ch.Cancel(consumerName, false); err != nil { // closes deliveries once drained
		return fmt.Errorf("cancel the consumer: %w", err)
	}
	wg.Wait()
	return nil
}

// handle applies one delivery and acks it after the commit; a failure requeues it.
func handle(ctx context.Context, pool *pgxpool.Pool, d amqp.Delivery, rec *latency.Recorder, log *slog.Logger) {
	o, err := inboxtx.Decode(d.Body)
	if err == nil {
		id := d.MessageId
		if id == "" {
			id = o.EventID
		}
		_, err = inboxtx.Apply(ctx, pool, consumerName, id, d.Body, o)
	}
	if err != nil {
		log.Warn("message failed; requeued", "message_id", d.MessageId, "error", err)
		_ = d.Nack(false, true)
		return
	}
	committed := time.Now()
	if ms, ok := d.Headers[load.TimestampHeader].(int64); ok {
		rec.Record(ms, committed)
	}
	if err := d.Ack(false); err != nil {
		log.Warn("ack failed after commit", "message_id", d.MessageId, "error", err)
	}
}
