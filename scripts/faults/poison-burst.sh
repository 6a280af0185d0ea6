#!/usr/bin/env bash
# poison-burst: 50 poison messages at once (malformed JSON, wrong types, missing
# fields, bad amounts and currencies, no id, too large, wrong content type...),
# then 300 valid orders. Each poison message is dead-lettered once with its
# reason in x-dead-letter-reason, never looped, and the service goes on.
# Proves: poison ends in the dead-letter queue by reason, no payment for it, and
# the orders after the burst are all paid by the same, never restarted, process.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init poison-burst "$@"

stack_up 1
FIRST=$(service_instance 1)
publish_bg burst -count 0 -poison 50
wait_publishers
publish_bg after -count 300 -duplicate-rate 0.1 -rate 100
wait_publishers
note "a burst of 50 poison messages, then 300 valid orders"
wait_drain

scenario_checks() {
  local dead
  dead=$(report_value dead-lettered)
  expect "all 50 poison messages dead-lettered ($dead)" eq "$dead" 50
  expect "the orders after the burst are all paid ($(report_value payments) = 300)" eq "$(report_value payments)" 300
  expect "the same process handled everything, no crash, no restart" eq "$(service_instance 1)" "$FIRST"
}
finish
