#!/usr/bin/env bash
# crash-after-gateway-charge: the card is charged, then the service dies before
# the payment row is written. The transaction rolls back, RabbitMQ redelivers,
# the service charges again with the same Idempotency-Key (derived from the
# order, not the attempt) and the gateway replays its stored result instead of
# charging a second time.
# Proves: no order charged twice, every payment has its charge; the gateway's
# replay count is > 0.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init crash-after-gateway-charge "$@"

stack_up 1
publish_bg orders -count 500 -duplicate-rate 0.1 -rate 40
crash_phase after-gateway-charge 0.03 10
wait_publishers
wait_drain

scenario_checks() {
  local replays
  replays=$(report_value 'gateway replays served')
  note "the gateway served $replays stored results again (Idempotent-Replayed) instead of charging a second time"
  expect "the service crashed after the gateway charge at least twice ($CRASHES)" gt "$CRASHES" 1
  expect "gateway replays served > 0 ($replays)" gt "$replays" 0
}
finish
