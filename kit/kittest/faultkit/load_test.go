package faultkit

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// The load takes a cluster's AMQP_URL, every node of it: a node that is down
// (here a closed port listed first) is passed over, and every message is
// confirmed through the next.
func TestPublishTakesEveryNodeOfAList(t *testing.T) {
	good := testenv.VHost(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1:1"
	testenv.WithChannel(t, good, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("load", true, false, false, false, nil)
		return err
	})
	msgs := make([]amqp.Publishing, 20)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte("{}")}
	}
	if err := Publish(u.String()+","+good, "", "load", msgs, 200, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var got int
	testenv.WithChannel(t, good, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive("load", true, false, false, false, nil)
		got = q.Messages
		return err
	})
	if got != len(msgs) {
		t.Fatalf("%d of %d messages in the queue", got, len(msgs))
	}
}
