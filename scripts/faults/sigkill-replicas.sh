#!/usr/bin/env bash
# sigkill-replicas: two replicas share the work queue; one of them, at random,
# gets SIGKILL every 1-3 s under load and is restarted (as a supervisor would).
# Whatever each held unacked goes to the other replica or back to the queue.
# Proves: nothing lost, no order charged twice, with competing consumers and
# kills at arbitrary points of the flow.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init sigkill-replicas "$@"

# shellcheck disable=SC2317 # called through fault_rounds
kill_random_replica() {
  local i
  i=$(random_replica)
  service_kill "$i"
  say "SIGKILL replica $i"
}

stack_up 2
publish_bg orders -count 600 -duplicate-rate 0.1 -rate 40
fault_rounds 5 1 3 kill_random_replica
supervise
note "$KILLS SIGKILLs at random moments to one of two replicas under load, each restarted ($RESTARTS restarts)"
wait_publishers
wait_drain

scenario_checks() {
  expect "replicas were SIGKILLed at least 3 times ($KILLS)" gt "$KILLS" 2
}
finish
