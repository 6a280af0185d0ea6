package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/outbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// A service that declares Publishes gets Kit.Outbox, and the kit runs the
// relay: every event a handler enqueues from its writes is published once,
// with its outbox id as the message_id, in both modes.
func TestPublishingServiceEmitsThroughItsOutbox(t *testing.T) {
	for _, mode := range []string{ModeInline, ModeBuffered} {
		t.Run(mode, func(t *testing.T) {
			amqpURL := testenv.VHost(t)
			_, dbURL := testenv.MigratedDB(t)
			t.Setenv("AMQP_URL", amqpURL)
			t.Setenv("DATABASE_URL", dbURL)
			t.Setenv("HTTP_ADDR", "127.0.0.1:0")
			t.Setenv("INBOX_MODE", mode)
			opts := shippingOptions(&shippingSettings{})
			opts.Publishes = []string{"shipments"}
			opts.NewHandler = func(k *Kit) (consumer.Handler, error) {
				return consumer.HandlerFunc(func(_ context.Context, msg consumer.Message) (consumer.Writes, error) {
					return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
						_, err := k.Outbox.Enqueue(ctx, tx, outbox.Message{Exchange: "shipments", RoutingKey: "shipment.booked",
							Body: msg.Body, OrderingKey: msg.ID})
						return consumer.OutcomeProcessed, err
					}, nil
				}), nil
			}
			testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
				if err := ch.ExchangeDeclare("shipments", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
					return err
				}
				if _, err := ch.QueueDeclare("sink", true, false, false, false, nil); err != nil {
					return err
				}
				return ch.QueueBind("sink", "#", "shipments", false, nil)
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			logs := &testenv.Buffer{}
			go func() { done <- Run(ctx, opts, nil, logs) }()
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(logs.String())
				}
			})
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			testenv.Eventually(t, 30*time.Second, "the service consuming (its topology declared)", func() (bool, error) {
				conn, err := amqp.Dial(amqpURL)
				if err != nil {
					return false, err
				}
				defer conn.Close()
				ch, err := conn.Channel()
				if err != nil {
					return false, err
				}
				q, err := ch.QueueDeclarePassive("shipping-service.order-paid", true, false, false, false, nil)
				return err == nil && q.Consumers > 0, nil
			})
			const n = 50
			msgs := make([]amqp.Publishing, n)
			for i := range msgs {
				msgs[i] = amqp.Publishing{MessageId: fmt.Sprintf("in-%d", i), ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i)}
			}
			testenv.Publish(t, amqpURL, "payments", "order.paid", msgs...)
			testenv.Eventually(t, time.Minute, "50 events in the sink", func() (bool, error) {
				return testenv.QueueDepth(t, amqpURL, "sink") == n, nil
			})
			testenv.Eventually(t, 30*time.Second, "every outbox row marked sent", func() (bool, error) {
				return testenv.Count(t, dbURL, `SELECT count(*) FROM outbox WHERE status <> 'sent'`) == 0, nil
			})
			if ids := testenv.Count(t, dbURL, `SELECT count(DISTINCT id) FROM outbox`); ids != n {
				t.Errorf("%d outbox rows, want %d", ids, n)
			}
		})
	}
}
