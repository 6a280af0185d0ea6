#!/usr/bin/env bash
# database-restart: the payments database drops every session under load.
# Local mode runs faultkit.DatabaseSessionsTerminated (every session of the
# run's database terminated, five times) and leaves the shared PostgreSQL
# cluster alone; compose mode restarts the postgres container twice. Transactions cut
# short roll back; the service requeues or retries the message, pauses while the
# database does not answer, and resumes by itself.
# Proves: nothing lost, nothing applied twice when the database goes away.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init database-restart "$@"

ROUNDS=0
drop_database() {
  ROUNDS=$((ROUNDS + 1))
  say "restarting postgres"
  compose restart postgres >/dev/null 2>&1 || die "docker compose restart postgres failed"
}

stack_up 1
publish_bg orders -count 400 -duplicate-rate 0.1 -rate 40
supervise_for 2
drop_database
supervise_for 3
drop_database
note "the postgres container was restarted $ROUNDS times under load"
wait_publishers
wait_drain

scenario_checks() {
  note "the service paused consuming $(metric_sum 'consumer_pauses_total{consumer="payment-service"}') times and scheduled $(metric_sum 'consumer_messages_total{consumer="payment-service",outcome="retried"}') retries"
}
finish
