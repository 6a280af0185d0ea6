#!/usr/bin/env bash
# database-restart: the payments database drops every session under load.
# Local mode terminates all backends of the run's payments database
# (pg_terminate_backend), eight times, and leaves the shared PostgreSQL cluster
# alone; compose mode restarts the postgres container twice. Transactions cut
# short roll back; the service requeues or retries the message, pauses while the
# database does not answer, and resumes by itself.
# Proves: nothing lost, nothing applied twice when the database goes away.
# shellcheck source=../lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
kit_init database-restart "$@"

KILLED=0
ROUNDS=0
drop_database() {
  ROUNDS=$((ROUNDS + 1))
  if [[ $MODE == local ]]; then
    local n
    n=$(kill_db_backends) || n=0
    KILLED=$((KILLED + n))
    say "terminated $n backends of the payments database"
  else
    say "restarting postgres"
    compose restart postgres >/dev/null 2>&1 || die "docker compose restart postgres failed"
  fi
}

stack_up 1
publish_bg orders -count 400 -duplicate-rate 0.1 -rate 40
supervise_for 2
if [[ $MODE == local ]]; then
  for _ in 1 2 3 4 5 6 7 8; do
    drop_database
    supervise_for 1
  done
  note "every session of the payments database was terminated $ROUNDS times under load ($KILLED backends in all)"
else
  drop_database
  supervise_for 3
  drop_database
  note "the postgres container was restarted $ROUNDS times under load"
fi
wait_publishers
wait_drain

scenario_checks() {
  note "the service paused consuming $(metric_sum 'consumer_pauses_total{consumer="payment-service"}') times and scheduled $(metric_sum 'consumer_messages_total{consumer="payment-service",outcome="retried"}') retries"
  if [[ $MODE == local ]]; then
    expect "backends were terminated ($KILLED)" gt "$KILLED" 0
  fi
}
finish
