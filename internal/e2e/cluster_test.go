//go:build cluster

package e2e_test

import (
	"testing"

	"github.com/inbox-template/payment-service/kit/kittest/faultkit"
)

// The payment service on the local three-node cluster (scripts/cluster.sh),
// built only with -tags cluster (scripts/faults/broker-node-loss.sh, which
// CI runs in both modes): two replicas and their outbox relays under a load
// of 50 messages a second (orders, 10% duplicates, 20 poison), while
// the node that leads the work queue is killed twice, the first time for
// longer than the reconnect backoff. Then inboxctl verify: every valid order paid
// once, none charged twice, only the poison dead-lettered, the outbox
// drained (its every OrderPaid in the sink queue). The load is 1,000 orders
// (about 22 s), then batches of 500 (clusterLoadMore, 11 s each) while rounds
// remain, so every kill hits it by construction and it ends with the last
// round: a round (finding the leader, the kill, 3 s or 10 s down, the node's
// start, 2 s) takes about 19 s here, 26 s the long one, 45 s on a loaded
// machine, so a run of one mode is about 2,000 orders, more when the machine
// is slow; side by side, a mode's load also goes on through the other's
// rounds that come between its own.
// (A fixed 10,000 at 75/s plus the batches once made 22,000 orders and
// 500 s a mode on a loaded CI machine.)
//
// The two modes run side by side (make test-node-loss, as CI runs them):
// each on its vhost of the cluster, their kills in turn (the cluster's
// rounds): each mode's replicas live through its own two kills of its
// queue's leader and those of the other's that come before its drain (a
// drain and its checks hold the rounds: no node dies under them). (Five kills a mode, one after the
// other, took 12 to 13 minutes of a loaded CI run: each round waits for a
// node to boot. Three a mode, short, long and short, cost two rounds of a
// minute of CI: long then short proves the same, a reconnect past the
// backoff and a failover after it.)
func TestPaymentOnCluster(t *testing.T) {
	t.Parallel()
	faultkit.Run(t, []faultkit.Scenario{faultkit.BrokerNodeLoss("payments.order-placed", nodeLossKills)}, paymentTrial(nil, clusterLoad))
}

// The same with the buffered inbox.
func TestPaymentOnClusterBuffered(t *testing.T) {
	t.Parallel()
	faultkit.Run(t, []faultkit.Scenario{faultkit.BrokerNodeLoss("payments.order-placed", nodeLossKills)}, paymentTrial(bufferedFaultEnv, clusterLoad))
}

// nodeLossKills is each mode's count of leader kills: one past the reconnect
// backoff, then a short one, a failover after that reconnect
// (BrokerNodeLoss's round (kills-1)/2 is the long one).
const nodeLossKills = 2

var clusterLoad = []string{"-count", "1000", "-duplicate-rate", "0.1", "-poison", "20", "-rate", "50", "-timeout", "10m"}
