// Command bench-watermill is the bench's Watermill consumer: watermill-amqp v3's
// subscriber with the defaults of amqp.NewDurableQueueConfig (its durable work
// queue recipe: prefetch 1 per subscription), N router handlers on the queue,
// each message's inbox claim and payment insert in one pgx transaction, acked
// after the commit when the handler returns nil.
//
// Two settings differ from the defaults, because without them it cannot
// consume this queue at all:
//   - Queue.Arguments are the work queue's quorum arguments: the default
//     declaration (a classic queue) is refused for the pre-filled quorum queue
//     with PRECONDITION_FAILED;
//   - the marshaler turns non-string headers into strings before Watermill's
//     DefaultMarshaler sees them: that one fails on any non-string header (here
//     the int64 timestamp_in_ms), and the subscriber then nacks with requeue,
//     forever.
//
// The dedupe key is the body's event_id (the publisher sets the AMQP message_id
// to the same value): Watermill's message carries neither the message_id
// property nor, from a non-Watermill producer, a UUID.
//
// On SIGTERM it closes the router, which finishes the messages in hand, and
// writes one publish→commit sample per message to -samples.
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
	"strconv"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/bench/internal/broker"
	"github.com/inbox-template/payment-service/bench/internal/inboxtx"
	"github.com/inbox-template/payment-service/bench/internal/latency"
	"github.com/inbox-template/payment-service/bench/internal/load"
)

const consumerName = "bench-watermill"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-watermill:", err)
		os.Exit(1)
	}
}

type options struct {
	amqpURL, databaseURL, samplesPath string
	handlers                          int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench-watermill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.amqpURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "broker URL (its vhost holds the work queue)")
	fs.StringVar(&o.databaseURL, "database-url", "", "payments database, migrated by inboxctl migrate")
	fs.StringVar(&o.samplesPath, "samples", "", "write publish→commit samples here at exit")
	fs.IntVar(&o.handlers, "handlers", 8, "router handlers, each its own subscription; also the pool size")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.databaseURL == "" || o.handlers < 1 {
		return o, errors.New("need -database-url and -handlers ≥ 1")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := watermill.NewSlogLogger(slog.New(slog.NewJSONHandler(stderr, nil)))
	pool, err := inboxtx.Open(ctx, o.databaseURL, consumerName, o.handlers)
	if err != nil {
		return err
	}
	defer pool.Close()

	cfg := wamqp.NewDurableQueueConfig(o.amqpURL)
	cfg.Queue.Arguments = broker.QueueArgs()
	cfg.Marshaler = stringHeaders{wamqp.DefaultMarshaler{}}
	sub, err := wamqp.NewSubscriber(cfg, logger)
	if err != nil {
		return fmt.Errorf("watermill subscriber: %w", err)
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return fmt.Errorf("watermill router: %w", err)
	}
	var rec latency.Recorder
	for i := range o.handlers {
		router.AddConsumerHandler(fmt.Sprintf("payments-%d", i), broker.Queue, sub, handler(pool, &rec))
	}
	if err := router.Run(ctx); err != nil { // returns once ctx ends and the handlers are done
		return fmt.Errorf("watermill router: %w", err)
	}
	if o.samplesPath == "" {
		return nil
	}
	return rec.WriteFile(o.samplesPath)
}

func handler(pool *pgxpool.Pool, rec *latency.Recorder) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		o, err := inboxtx.Decode(msg.Payload)
		if err != nil {
			return err
		}
		ctx := context.WithoutCancel(msg.Context()) // a started transaction finishes
		if _, err := inboxtx.Apply(ctx, pool, consumerName, o.EventID, msg.Payload, o); err != nil {
			return err
		}
		committed := time.Now()
		if ms, err := strconv.ParseInt(msg.Metadata.Get(load.TimestampHeader), 10, 64); err == nil {
			rec.Record(ms, committed)
		}
		return nil
	}
}

// stringHeaders is Watermill's DefaultMarshaler with every header value made a
// string first, which is all that DefaultMarshaler accepts.
type stringHeaders struct {
	wamqp.DefaultMarshaler
}

func (m stringHeaders) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	headers := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		if s, ok := v.(string); ok {
			headers[k] = s
		} else {
			headers[k] = fmt.Sprint(v)
		}
	}
	d.Headers = headers
	return m.DefaultMarshaler.Unmarshal(d)
}
