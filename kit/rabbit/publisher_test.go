package rabbit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

func TestPublisher(t *testing.T) {
	conn, err := amqp.Dial(testenv.VHost(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	pub, err := rabbit.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := amqp.Publishing{Body: []byte("x")}
	if err := pub.Publish(ctx, "", "q", msg); err != nil {
		t.Fatalf("publish to a queue: %v", err)
	}
	if err := pub.Publish(ctx, "", "no-such-queue", msg); !errors.Is(err, rabbit.ErrReturned) {
		t.Fatalf("publish no queue takes: %v, want ErrReturned", err)
	}
	if err := pub.Publish(ctx, "", "q", msg); err != nil {
		t.Fatalf("publish after a return: %v", err)
	}
	// After its channel closed, a publish fails at once instead of spinning
	// on the closed returns channel.
	_ = pub.Close()
	done := make(chan error, 1)
	go func() { done <- pub.Publish(ctx, "", "q", msg) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("publish on a closed channel succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("publish on a closed channel hangs")
	}
}
