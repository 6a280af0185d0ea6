#!/usr/bin/env bash
# crash-after-outbox-publish: the relay's duplicate. The payment service's
# outbox relay publishes a batch of OrderPaid events, the broker confirms it,
# and the service dies before it marks the rows sent; after the restart (or
# the other replica, once the lease ends) the relay publishes them again with
# the same message ids, and the shipping service's inbox suppresses them.
# Proves: nothing lost along the pipeline, no pickup booked twice, and the
# republished events were suppressed downstream.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init crash-after-outbox-publish "$@"

stack_up 2
publish_bg orders -count 500 -duplicate-rate 0.1 -rate 40
crash_phase after-outbox-publish 0.05 10
wait_publishers
wait_drain

scenario_checks() {
  local republished
  republished=$(LOGS_OF=shipping-service count_logged '"msg":"message duplicate"')
  note "$republished events published again after a crash between the broker's confirm and the mark were suppressed by the shipping inbox (log: \"message duplicate\")"
  expect "the relay died after a confirm at least twice ($CRASHES)" gt "$CRASHES" 1
  expect "republished events suppressed by the shipping inbox > 0 ($republished)" gt "$republished" 0
}
finish
