package service

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// A queue argument changed against the queue the broker holds: the broker
// refuses the redeclare (PRECONDITION_FAILED) at every session, so the
// service would reconnect forever, not ready. It refuses to start instead,
// naming the variable and both values, in either mode.
func TestChangedQueueArgumentRefusesToStart(t *testing.T) {
	cases := []struct{ variable, value, have, want string }{
		{"QUEUE_DELIVERY_LIMIT", "5", "'20'", "'5'"},
		{"DEAD_LETTER_EXCHANGE", "other.dlx", "'shipping-service.dlx'", "'other.dlx'"},
		{"SINGLE_ACTIVE_CONSUMER", "true", "none", "'true'"},
	}
	for _, mode := range []string{ModeInline, ModeBuffered} {
		for _, c := range cases {
			t.Run(mode+"/"+c.variable, func(t *testing.T) {
				amqpURL := testenv.VHost(t)
				_, dbURL := testenv.MigratedDB(t, migrations.Inbox, migrations.Buffered)
				t.Setenv("AMQP_URL", amqpURL)
				t.Setenv("DATABASE_URL", dbURL)
				t.Setenv("HTTP_ADDR", "127.0.0.1:0")
				t.Setenv("INBOX_MODE", mode)
				opts := shippingOptions(&shippingSettings{})
				opts.NewHandler = func(*Kit) (consumer.Handler, error) {
					return consumer.HandlerFunc(func(context.Context, consumer.Message) (consumer.Writes, error) { return nil, nil }), nil
				}
				cfg, err := LoadConfig(opts)
				if err != nil {
					t.Fatal(err)
				}
				testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error { return Topology(cfg).Declare(ch) })

				t.Setenv(c.variable, c.value)
				msg := refusedStart(t, opts)
				for _, want := range []string{c.variable + ":", c.have, c.want, "delete_queue"} {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q does not name %q", msg, want)
					}
				}
			})
		}
	}
}

// An earlier version of the template declared the dead-letter queue as a
// classic queue; this one declares it a quorum queue, and the broker refuses
// the redeclare. The service refuses to start with the upgrade's steps: its
// dead letters must be replayed or purged before the queue is deleted.
func TestClassicDeadLetterQueueOfAnEarlierVersionRefusesToStart(t *testing.T) {
	amqpURL := testenv.VHost(t)
	_, dbURL := testenv.MigratedDB(t, migrations.Inbox)
	t.Setenv("AMQP_URL", amqpURL)
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("HTTP_ADDR", "127.0.0.1:0")
	opts := shippingOptions(&shippingSettings{})
	opts.NewHandler = func(*Kit) (consumer.Handler, error) {
		return consumer.HandlerFunc(func(context.Context, consumer.Message) (consumer.Writes, error) { return nil, nil }), nil
	}
	cfg, err := LoadConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(cfg.DeadLetterQueue, true, false, false, false, amqp.Table{"x-queue-type": "classic"})
		return err
	})
	msg := refusedStart(t, opts)
	for _, want := range []string{"DEAD_LETTER_QUEUE:", "'classic'", "earlier version", "dlq replay", "dlq purge", "delete_queue " + cfg.DeadLetterQueue} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
}

// refusedStart runs the service, which must refuse to start within 20 s,
// and returns its error's text.
func refusedStart(t *testing.T, opts Options) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Run(ctx, opts, nil, io.Discard)
	if ctx.Err() != nil {
		t.Fatal("the service ran on until the test's deadline instead of refusing to start")
	}
	if err == nil {
		return ""
	}
	return err.Error()
}
