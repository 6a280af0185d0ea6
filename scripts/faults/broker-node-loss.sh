#!/usr/bin/env bash
# broker-node-loss: on a three-node RabbitMQ cluster, the node that leads the
# work queue gets SIGKILL under load (twice in local mode, five times in
# Compose mode), each started again after a few seconds, once after 10 s
# (longer than the reconnect backoff). The quorum
# queues elect another leader, which redelivers what was unacked; the replicas
# and the outbox relays connected to the lost node reconnect to another (every
# node is in AMQP_URL), and so does the publisher.
# Local mode runs faultkit.BrokerNodeLoss (go test -tags cluster) on the local
# cluster of scripts/cluster.sh (started if it is not up, left up; it needs
# root), two kills under 50 messages a second for as long as they last
# (about 2,000 orders); the machine's broker is not touched. Compose mode runs the stack
# with the profile "cluster", 10,000 orders at 75/s, and kills the leader's
# container.
# Proves: nothing lost, no order charged twice, nothing valid dead-lettered
# (QUEUE_DELIVERY_LIMIT counts each node loss once for the deliveries then
# unacked: 20 is well above the five of Compose mode and the four of the two
# local modes side by side), the outbox drained.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init broker-node-loss "$@"

QUEUE_NAME=${QUEUE:-payments.order-placed}
KIT_CLUSTER=1
stack_up 2
members=$(broker_ctl -q list_queues --no-table-headers name members | awk -v q="$QUEUE_NAME" '$1 == q' | grep -o 'rabbit@' | wc -l)
((members == 3)) || die "$QUEUE_NAME has $members replicas, want 3: the nodes had not joined when it was declared"
publish_bg orders -count 10000 -duplicate-rate 0.1 -poison 20 -rate 75
supervise_for 5
lost="" under_load=0
for round in 1 2 3 4 5; do
  down=3
  ((round == 3)) && down=10
  node=""
  deadline=$((SECONDS + 60))
  until node=$(queue_leader "$QUEUE_NAME") && [[ -n $node ]]; do
    ((SECONDS < deadline)) || die "$QUEUE_NAME has no leader after 60 s"
    supervise_for 1
  done
  say "SIGKILL $node, the leader of $QUEUE_NAME, for ${down}s"
  publishers_running && under_load=$((under_load + 1))
  node_kill "$node"
  lost+="$node "
  supervise_for "$down"
  node_start "$node" || die "$node did not start again"
  say "$node up again"
  supervise_for 2
done
note "the node leading $QUEUE_NAME was killed 5 times, $under_load of them under load ($lost), once for 10 s"
distinct=$(tr ' ' '\n' <<<"$lost" | sort -u | grep -c .)
wait_publishers
wait_drain

scenario_checks() {
  local failovers
  failovers=$(metric_sum 'consumer_broker_failovers_total{consumer="payment-service"}')
  note "consumer failovers: $failovers; publisher reconnects: $(summary_field reconnects)"
  expect "a replica failed over to another node ($failovers)" gt "$failovers" 0
  expect "every kill hit the load ($under_load of 5 while order-publisher ran)" eq "$under_load" 5
  expect "the leadership moved: $distinct different nodes led the queue when killed" gt "$distinct" 1
}
finish
