#!/usr/bin/env bash
# broker-restart: RabbitMQ goes away under load (twice) and comes back. The
# service sees its connection die, reports not ready, reconnects with backoff,
# declares its topology again and consumes; deliveries of the dead channel are
# never acked on the new one. The publisher republishes what was not confirmed.
# Local mode runs faultkit.BrokerRestart (go test -tags disruptive), which
# stops the whole local broker (rabbitmqctl stop_app / start_app): every
# vhost, every other user of it. Compose mode restarts the rabbitmq container.
# Proves: nothing lost across a broker restart, nothing applied twice.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init broker-restart "$@"


restart_broker() {
  say "stopping the broker"
  broker_stop_app
  sleep 4
  say "starting the broker"
  broker_start_app || die "the broker did not start again"
  say "broker up"
}

stack_up 1
publish_bg orders -count 400 -duplicate-rate 0.1 -rate 30
supervise_for 3
restart_broker
supervise_for 4
restart_broker
note "RabbitMQ stopped for 4 s and started again, twice, while 400 orders were being published and consumed"
wait_publishers
wait_drain

scenario_checks() {
  local reconnects pub
  reconnects=$(metric_sum 'consumer_reconnects_total{consumer="payment-service"}')
  pub=$(summary_field reconnects)
  note "the service reconnected $reconnects times, the publisher $pub times (republishing $(summary_field republished_after_reconnect) unconfirmed messages)"
  expect "the service reconnected at least twice ($reconnects)" gt "$reconnects" 1
}
finish
