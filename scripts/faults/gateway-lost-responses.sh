#!/usr/bin/env bash
# gateway-lost-responses: the fake gateway stores 30% of the charges and then
# drops the connection without an answer (POST /faults lost_response_rate).
# The service cannot know whether the card was charged: it retries with the
# same Idempotency-Key, and the gateway answers with the stored result.
# Proves: no order charged twice, every payment has its charge, every charge
# its payment; the gateway's replay count is > 0.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init gateway-lost-responses "$@"

stack_up 1
gateway_faults '{"lost_response_rate":0.3}'
say "fake gateway: 30% of the responses are lost after the charge is stored"
publish_bg orders -count 400 -duplicate-rate 0.1 -rate 50
wait_publishers
supervise_for 3
gateway_faults '{"lost_response_rate":0}'
note "the fake gateway dropped 30% of its responses after storing the charge (lost_response_rate 0.3) while 400 orders were published"
wait_drain

scenario_checks() {
  local replays retried
  replays=$(report_value 'gateway replays served')
  retried=$(metric_sum 'consumer_messages_total{consumer="payment-service",outcome="retried"}')
  note "the service retried $retried times; the gateway replayed $replays stored results"
  expect "gateway replays served > 0 ($replays)" gt "$replays" 0
  expect "the service retried after lost responses ($retried)" gt "$retried" 0
}
finish
