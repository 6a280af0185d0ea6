#!/usr/bin/env bash
# crash-after-commit: the classic duplicate. The service commits the payment and
# its inbox row, then dies before the ack; RabbitMQ delivers the message again
# and the inbox (INSERT … ON CONFLICT DO NOTHING, zero rows) suppresses it.
# Proves: nothing lost, no order charged twice, and the redeliveries were
# suppressed (logged as duplicates with redelivered=true).
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init crash-after-commit "$@"

stack_up 1
publish_bg orders -count 500 -duplicate-rate 0.1 -rate 40
crash_phase after-commit 0.03 10
wait_publishers
wait_drain

scenario_checks() {
  local redelivered
  redelivered=$(count_logged '"msg":"message duplicate"' '"redelivered":true')
  note "$redelivered redelivered messages were found already applied by the inbox and suppressed (log: \"message duplicate\", redelivered=true)"
  expect "the service crashed after commit at least twice ($CRASHES)" gt "$CRASHES" 1
  expect "redeliveries suppressed by the inbox > 0 ($redelivered)" gt "$redelivered" 0
  expect "duplicates suppressed > 0 ($(report_value 'duplicates suppressed'))" gt "$(report_value 'duplicates suppressed')" 0
}
finish
