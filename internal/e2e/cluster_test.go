//go:build cluster

package e2e_test

import (
	"testing"

	"github.com/inbox-template/payment-service/internal/kit/testenv/faultkit"
)

// The payment service on the local three-node cluster (scripts/cluster.sh),
// built only with -tags cluster (scripts/faults/broker-node-loss.sh, which
// CI runs in both modes): two replicas and their outbox relays under a load
// of 50 messages a second (orders, 10% duplicates, 20 poison), while
// the node that leads the work queue is killed five times, once for longer
// than the reconnect backoff. Then inboxctl verify: every valid order paid
// once, none charged twice, only the poison dead-lettered, the outbox
// drained (its every OrderPaid in the sink queue). The load is 1,000 orders
// (about 22 s), then batches of 500 (clusterLoadMore, 11 s each) while rounds
// remain, so every kill hits it by construction and it ends with the last
// round: a round (finding the leader, the kill, 3 s or 10 s down, the node's
// start, 2 s) takes about 19 s here, 26 s the long one, 45 s on a loaded
// machine, so a run is about 5,000 orders, more when the machine is slow.
// (A fixed 10,000 at 75/s plus the batches once made 22,000 orders and
// 500 s a mode on a loaded CI machine.)
func TestPaymentOnCluster(t *testing.T) {
	faultkit.Run(t, []faultkit.Scenario{faultkit.BrokerNodeLoss("payments.order-placed", 5)}, paymentTrial(nil, clusterLoad))
}

// The same with the buffered inbox.
func TestPaymentOnClusterBuffered(t *testing.T) {
	faultkit.Run(t, []faultkit.Scenario{faultkit.BrokerNodeLoss("payments.order-placed", 5)}, paymentTrial(bufferedFaultEnv, clusterLoad))
}

var clusterLoad = []string{"-count", "1000", "-duplicate-rate", "0.1", "-poison", "20", "-rate", "50", "-timeout", "10m"}
