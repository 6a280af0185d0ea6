#!/usr/bin/env bash
# crash-after-ack: the service dies right after an ack. The acked message is
# done and never comes back; the other deliveries it held (prefetch) are
# redelivered: those not committed yet are processed, those committed are
# suppressed by the inbox.
# Proves: nothing lost, nothing applied twice, queues drained.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init crash-after-ack "$@"

stack_up 1
publish_bg orders -count 500 -duplicate-rate 0.1 -rate 40
crash_phase after-ack 0.03 10
wait_publishers
wait_drain

scenario_checks() {
  local inbox
  inbox=$(psql_payments "SELECT count(*) FROM inbox")
  note "after the drain the inbox holds $inbox rows: one per distinct message id published ($(report_value 'orders published'))"
  expect "one inbox row per distinct message id ($inbox = $(report_value 'orders published'))" eq "$inbox" "$(report_value 'orders published')"
  expect "the service crashed after an ack at least twice ($CRASHES)" gt "$CRASHES" 1
}
finish
