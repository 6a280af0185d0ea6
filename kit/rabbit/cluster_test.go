//go:build cluster

package rabbit_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// On a three-node cluster every queue of the topology is a quorum queue
// with a replica on each node by default (the dead-letter queue too: a
// classic one would live on one node), or on QuorumGroupSize nodes.
func TestTopologyIsReplicatedOnACluster(t *testing.T) {
	c := testenv.NewCluster(t)
	topo := func(prefix string, size int) rabbit.Topology {
		return rabbit.Topology{Exchange: prefix + ".orders", RoutingKey: "k", Queue: prefix + ".work",
			DeadLetterExchange: prefix + ".dlx", DeadLetterQueue: prefix + ".work.dlq", DeliveryLimit: 20,
			RetryDelays: []time.Duration{time.Second}, QuorumGroupSize: size}
	}
	for _, tt := range []struct {
		topo rabbit.Topology
		want int
	}{{topo("default", 0), 3}, {topo("two", 2), 2}} {
		testenv.WithChannel(t, c.URL(), func(ch *amqp.Channel) error { return tt.topo.Declare(ch) })
		for _, q := range []string{tt.topo.Queue, tt.topo.RetryQueue(time.Second), tt.topo.DeadLetterQueue} {
			if n := c.Members(q); n != tt.want {
				t.Errorf("%s has %d replicas, want %d", q, n, tt.want)
			}
		}
	}
}
