//go:build cluster

package testenv

import (
	"errors"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The cluster's queue counts come from each queue's leader, whichever node
// is asked: only the leader keeps a quorum queue's counts. The queue here
// is led by node 2, and node 1 answers first; the listing is rabbitmqctl's.
func TestClusterQueuesCountOnTheLeadersNode(t *testing.T) {
	c := NewCluster(t)
	WithChannel(t, c.NodeURL(2), func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare("led-by-2", true, false, false, false,
			amqp.Table{"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"}); err != nil {
			return err
		}
		for range 3 {
			if err := ch.Publish("", "led-by-2", false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
				return err
			}
		}
		return nil
	})
	if l := c.Leader("led-by-2"); l != 2 {
		t.Fatalf("node %d leads the queue, want 2 (declared on node 2, leader client-local)", l)
	}
	var got, want []Queue
	Eventually(t, time.Minute, "the erl_call listing and rabbitmqctl's alike, 3 messages", func() (bool, error) {
		var ok bool
		if got, ok = queuesOn(c.liveNodes(), c.VHost()); !ok {
			return false, errors.New("no node answered erl_call")
		}
		out := c.Ctl("list_queues", "-q", "-p", c.VHost(), "--formatter", "json", "name", "messages", "messages_ready",
			"messages_unacknowledged", "consumers", "leader")
		var err error
		if want, err = ParseQueues(out); err != nil {
			return false, err
		}
		return reflect.DeepEqual(got, want) && len(got) == 1 && got[0].Counted && got[0].Messages == 3, nil
	})
	if got[0].Leader != nodeName(2) {
		t.Errorf("listed leader %q, want %s", got[0].Leader, nodeName(2))
	}
}
