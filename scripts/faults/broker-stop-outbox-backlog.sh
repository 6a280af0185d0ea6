#!/usr/bin/env bash
# broker-stop-outbox-backlog: the payment service's outbox relay has a backlog
# when RabbitMQ goes away for 20 s. A memory alarm first blocks every
# publishing connection, so that the relay cannot publish while the consumer
# goes on paying the queued orders (its acks travel on a connection that does
# not publish): the OrderPaid events pile up in the outbox. Then the broker
# stops, starts again, the alarm is cleared, and the relay drains the outbox.
# Local mode runs faultkit.BrokerStopOutboxBacklog (go test -tags disruptive),
# which stops the whole local broker and raises an alarm on it: every vhost,
# every other user of it is disturbed. Compose mode does it in the rabbitmq
# container.
# Proves: nothing lost from the outbox across a broker stop, nothing parked
# for it (the broker's absence spends no attempt), no pickup booked twice.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init broker-stop-outbox-backlog "$@"


unsent() { psql_payments "SELECT count(*) FROM outbox WHERE status = 'pending'"; }
# shellcheck disable=SC2317 # called through wait_until
backlog_of() { local n; n=$(unsent 2>/dev/null) || return 1; ((n >= $1)); }

stack_up 1
say "the service stops; 300 orders wait in its queue"
service_hold 1
publish_bg orders -count 300 -duplicate-rate 0.1 -rate 200
wait_publishers
alarm_on
say "memory alarm on (publishing blocks), the service starts again"
service_release 1
wait_until 120 "a backlog of 100 events in the outbox" backlog_of 100
backlog=$(unsent)
say "outbox backlog: $backlog events; stopping the broker for 20 s"
broker_stop_app
sleep 20
say "starting the broker"
broker_start_app || die "the broker did not start again"
alarm_off
say "broker up, alarm cleared"
note "the outbox held $backlog unsent events when RabbitMQ stopped for 20 s (a memory alarm had blocked the relay's publishes)"
wait_drain

scenario_checks() {
  local parked
  parked=$(psql_payments "SELECT count(*) FROM outbox WHERE status = 'parked'")
  expect "the outbox had a backlog of at least 100 events when the broker stopped ($backlog)" gt "$backlog" 99
  expect "no event parked for the broker's absence ($parked)" eq "$parked" 0
}
finish
