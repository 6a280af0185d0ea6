// Package load makes the OrderPlaced messages of a bench run and publishes them
// with publisher confirms, each stamped with the time it was handed to the
// broker, in milliseconds, in the header timestamp_in_ms (the header RabbitMQ's
// message-timestamp plugin sets): the AMQP timestamp property has whole seconds.
package load

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TimestampHeader carries the publish time in Unix milliseconds (int64).
const TimestampHeader = "timestamp_in_ms"

// Message is one publishing: a message id (also the body's event_id) and the
// OrderPlaced body.
type Message struct {
	ID   string
	Body []byte
	// PublishedAt is set by Publish: when the message was handed to the
	// broker (its timestamp header).
	PublishedAt time.Time
}

// orderPlaced is the event's contract (internal/payment/orders of the template).
type orderPlaced struct {
	EventID     string    `json:"event_id"`
	OrderID     string    `json:"order_id"`
	CustomerID  string    `json:"customer_id"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	PlacedAt    time.Time `json:"placed_at"`
	// ShippingAddress is optional; the pipeline's shipping service needs it.
	ShippingAddress string `json:"shipping_address"`
}

// Batch is a range of orders of one run.
type Batch struct {
	Run           string  // order ids are <Run>-<n>
	First, Count  int     // orders First … First+Count-1
	DuplicateRate float64 // probability that an order is published twice, back to back
	Seed          uint64
}

// Messages returns the batch in publishing order. A duplicate has the same
// message id and body as its order and follows it at once, as a producer's
// retry after a lost confirm does; so a consumer may hold both at the same time.
func (b Batch) Messages() []Message {
	rng := mrand.New(mrand.NewPCG(b.Seed, uint64(b.First)))
	msgs := make([]Message, 0, b.Count+int(float64(b.Count)*b.DuplicateRate*1.5)+8)
	for n := b.First; n < b.First+b.Count; n++ {
		o := orderPlaced{
			EventID:     newEventID(),
			OrderID:     fmt.Sprintf("%s-%d", b.Run, n),
			CustomerID:  fmt.Sprintf("cus-%d", 1+rng.IntN(1000)),
			AmountCents: 100 + rng.Int64N(99900),
			Currency:    [...]string{"EUR", "EUR", "EUR", "USD", "GBP"}[rng.IntN(5)],
			PlacedAt:    time.Now().UTC(),
			// From n, not the random numbers: the amounts of a seed stay the same.
			ShippingAddress: fmt.Sprintf("%d Bench Street, Berlin", n+1),
		}
		body, err := json.Marshal(o)
		if err != nil {
			panic(fmt.Sprintf("encode %+v: %v", o, err)) // strings, an int64 and a time always encode
		}
		m := Message{ID: o.EventID, Body: body}
		msgs = append(msgs, m)
		if rng.Float64() < b.DuplicateRate {
			msgs = append(msgs, m)
		}
	}
	return msgs
}

// newEventID returns a random UUID (version 4), as the template's producer does.
func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// window bounds the publishings awaiting their confirm.
const window = 1000

// Publish sends msgs to exchange with routingKey on a confirming channel, at
// most rate messages a second (0: as fast as the confirms come back), and
// returns once the broker has confirmed every one. Messages are persistent and
// mandatory; a returned or nacked one is an error.
func Publish(ctx context.Context, amqpURL, exchange, routingKey string, msgs []Message, rate float64) error {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return fmt.Errorf("connect to publish: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	// Returns are drained as they come (an undrained Notify channel blocks the
	// connection) and counted once the channel is closed.
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	returned := make(chan int, 1)
	go func() {
		n := 0
		for range returns {
			n++
		}
		returned <- n
	}()
	pubErr := publishAll(ctx, ch, exchange, routingKey, msgs, rate)
	closeErr := ch.Close() // closes returns, which ends the goroutine
	n := <-returned
	switch {
	case pubErr != nil:
		return pubErr
	case n > 0:
		return fmt.Errorf("%d messages returned unroutable by exchange %s", n, exchange)
	case closeErr != nil:
		return fmt.Errorf("close the publishing channel: %w", closeErr)
	}
	return nil
}

func publishAll(ctx context.Context, ch *amqp.Channel, exchange, routingKey string, msgs []Message, rate float64) error {
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	start := time.Now()
	for i, m := range msgs {
		if rate > 0 {
			if err := sleepUntil(ctx, start.Add(time.Duration(float64(i)/rate*float64(time.Second)))); err != nil {
				return err
			}
		}
		if len(pending) == window {
			if err := confirmed(ctx, pending[0]); err != nil {
				return err
			}
			pending = pending[1:]
		}
		now := time.Now()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    m.ID,
			Timestamp:    now,
			Headers:      amqp.Table{TimestampHeader: now.UnixMilli()},
			Body:         m.Body,
		})
		if err != nil {
			return fmt.Errorf("publish message %d of %d: %w", i+1, len(msgs), err)
		}
		msgs[i].PublishedAt = now
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		if err := confirmed(ctx, dc); err != nil {
			return err
		}
	}
	return nil
}

func confirmed(ctx context.Context, dc *amqp.DeferredConfirmation) error {
	ack, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("wait for a confirm: %w", err)
	case !ack:
		return fmt.Errorf("the broker nacked delivery tag %d", dc.DeliveryTag)
	}
	return nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
