#!/usr/bin/env bash
# broker-drops-connections: the broker closes every connection of the vhost
# (rabbitmqctl close_all_connections -p VHOST), five times under load: the
# service's and the publisher's. Unacked deliveries go back to the queue; the
# service reconnects and never acks an old delivery tag on a new channel; the
# publisher republishes unconfirmed messages.
# Proves: nothing lost, nothing applied twice across connection losses.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init broker-drops-connections "$@"

DROPS=0
drop_connections() {
  close_connections
  DROPS=$((DROPS + 1))
  say "closed every connection of the vhost ($DROPS)"
}

stack_up 1
publish_bg orders -count 500 -duplicate-rate 0.1 -rate 40
supervise_for 2
for _ in 1 2 3 4 5; do
  drop_connections
  supervise_for 2
done
note "the broker closed every connection of the vhost $DROPS times under load (close_all_connections)"
wait_publishers
wait_drain

scenario_checks() {
  local reconnects
  reconnects=$(metric_sum 'consumer_reconnects_total{consumer="payment-service"}')
  note "the service reconnected $reconnects times, the publisher $(summary_field reconnects) times (republishing $(summary_field republished_after_reconnect) unconfirmed messages)"
  expect "the service reconnected after the drops ($reconnects ≥ 3)" gt "$reconnects" 2
}
finish
