package testenv

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// WithChannel runs f on a channel of a fresh connection to url (one URL, or
// a cluster's nodes separated by commas: the first live one), closed after.
func WithChannel(t testing.TB, url string, f func(*amqp.Channel) error) {
	t.Helper()
	conn, err := rabbit.Dial(url, 10*time.Second, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := f(ch); err != nil {
		t.Fatal(err)
	}
}

// QueueDepth is the number of ready messages in queue.
func QueueDepth(t testing.TB, url, queue string) int {
	t.Helper()
	var n int
	WithChannel(t, url, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}
