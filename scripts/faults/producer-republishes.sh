#!/usr/bin/env bash
# producer-republishes: the producer sends half of the orders twice with the
# same message id (a retry after a lost confirm) and half again under a new
# message id (a producer that re-emits the event). The first are caught by the
# inbox key, the second by the unique order_id of payments.
# Proves: one payment and one charge per order; every duplicate suppressed.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init producer-republishes "$@"

stack_up 1
publish_bg orders -count 300 -duplicate-rate 0.5 -republish-rate 0.5 -rate 100
wait_publishers
note "the producer sent $(summary_field duplicates) duplicates with the same message id and $(summary_field republishes) republishes under a new message id, for $(summary_field orders) orders"
wait_drain

scenario_checks() {
  local sent suppressed counted
  sent=$(($(summary_field duplicates) + $(summary_field republishes)))
  suppressed=$(report_value 'duplicates suppressed')
  counted=$(metric_sum 'consumer_messages_total{consumer="payment-service",outcome="duplicate"}')
  note "the service counted $counted duplicates (consumer_messages_total{outcome=\"duplicate\"})"
  expect "duplicates suppressed = duplicates + republishes sent ($suppressed = $sent)" eq "$suppressed" "$sent"
  expect "the service counted every one as a duplicate ($counted = $sent)" eq "$counted" "$sent"
  expect "one payment per order ($(report_value payments) = $(report_value 'orders published'))" eq "$(report_value payments)" "$(report_value 'orders published')"
}
finish
