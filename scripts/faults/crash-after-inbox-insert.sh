#!/usr/bin/env bash
# crash-after-inbox-insert: the service dies with the inbox row inserted and the
# transaction still open. PostgreSQL rolls the transaction back (the inbox row
# goes with it) and RabbitMQ redelivers the unacked message, which is then
# processed as new, not mistaken for a duplicate.
# Proves: nothing lost (a claimed but uncommitted message is not "already seen").
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init crash-after-inbox-insert "$@"

stack_up 1
publish_bg orders -count 500 -duplicate-rate 0.1 -rate 40
crash_phase after-inbox-insert 0.03 10
wait_publishers
wait_drain

scenario_checks() {
  local inbox payments
  inbox=$(psql_payments "SELECT count(*) FROM inbox")
  payments=$(report_value payments)
  note "after the drain the inbox holds $inbox rows for $payments payments: the rolled-back claims left no row behind"
  expect "the service crashed after the inbox insert at least twice ($CRASHES)" gt "$CRASHES" 1
  expect "one inbox row per order, none left by a rolled-back claim ($inbox rows, $payments payments)" eq "$inbox" "$payments"
}
finish
