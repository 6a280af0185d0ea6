#!/usr/bin/env bash
# chaos.sh [--duration 120s] [--orders N] [--local | --compose]
#
# Every fault at once, for a bounded time: thousands of orders (rate-limited to
# span most of the window) with duplicates, republishes and poison; two
# replicas with all five crash points armed at small probabilities (the
# outbox relay's too: the pipeline to the shipping service runs); random
# SIGKILLs; the broker closing every connection; the payments database's
# sessions terminated; the fake gateway answering 503 and losing responses.
# Then the faults stop, dead replicas are restarted, the queues drain, and
# inboxctl verify checks every invariant. Exit 0 only if all hold.
#
# Local mode (the default) runs the same in Go: TestPaymentChaos of
# internal/e2e (go test -tags chaos), which reads CHAOS_DURATION, CHAOS_ORDERS
# and CHAOS_CRASH_PROBABILITY; --compose runs it on the Compose stack.
# make chaos runs a bounded version (--duration 60s --orders 1500), CI a
# shorter one (.ci/run: --duration 30s --orders 1000, each mode)
# INBOX_MODE=buffered runs the service with the buffered inbox, with its two
# processing crash points (after-claim, after-process-commit) armed too.
# shellcheck source=lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

DURATION=120
ORDERS=3000
CRASH_P=${CHAOS_CRASH_PROBABILITY:-0.002}

usage() {
  cat <<EOF
usage: $0 [--duration 120s] [--orders 3000] [--local | --compose]

Runs every fault at once for --duration (seconds, or with an s or m suffix)
while --orders orders are published, then stops the faults, waits for the
queues to drain and runs inboxctl verify. Prints PASS chaos or FAIL chaos.
INBOX_MODE=buffered runs the service with the buffered inbox.
KEEP=1 keeps the Compose project; logs go to \${TMPDIR:-/tmp}/inbox-faults/.
EOF
}

to_seconds() {
  [[ $1 =~ ^([0-9]+)(s|m)?$ ]] || { echo "bad duration: $1 (want e.g. 90s or 2m)" >&2; exit 2; }
  if [[ ${BASH_REMATCH[2]} == m ]]; then echo $((BASH_REMATCH[1] * 60)); else echo "${BASH_REMATCH[1]}"; fi
}

rest=()
while (($#)); do
  case $1 in
    --duration) DURATION=$(to_seconds "${2:-}"); shift 2 ;;
    --duration=*) DURATION=$(to_seconds "${1#*=}"); shift ;;
    --orders) ORDERS=${2:-}; shift 2 ;;
    --orders=*) ORDERS=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) rest+=("$1"); shift ;;
  esac
done
if ! [[ $ORDERS =~ ^[0-9]+$ ]] || ((ORDERS == 0)); then
  echo "--orders must be a positive number" >&2
  exit 2
fi
# Four kinds of fault, one every 2 to 5 s: each must happen at least once.
((DURATION >= 20)) || { echo "--duration must be at least 20s" >&2; exit 2; }

# The local mode's Go chaos run (TestPaymentChaos) reads these.
export CHAOS_DURATION="${DURATION}s" CHAOS_ORDERS=$ORDERS CHAOS_CRASH_PROBABILITY=$CRASH_P
kit_init chaos "${rest[@]}"

DROPS=0
DB_ROUNDS=0
DB_BACKENDS=0
GATEWAY_CHANGES=0

# The actions of the chaos loop. shellcheck cannot see calls through "$@".
# shellcheck disable=SC2317
chaos_kill() {
  local i
  i=$(random_replica)
  service_kill "$i"
  say "chaos: SIGKILL replica $i"
}
# shellcheck disable=SC2317
chaos_drop() {
  close_connections
  DROPS=$((DROPS + 1))
  say "chaos: the broker closed every connection of the vhost"
}
# shellcheck disable=SC2317
chaos_db() {
  local n
  n=$(kill_db_backends) || n=0
  DB_ROUNDS=$((DB_ROUNDS + 1))
  DB_BACKENDS=$((DB_BACKENDS + n))
  say "chaos: terminated $n sessions of the payments database"
}
# shellcheck disable=SC2317
chaos_gateway() {
  local rates=(0 0.05 0.2) lost=(0 0.05 0.15) e l
  e=${rates[RANDOM % 3]}
  l=${lost[RANDOM % 3]}
  gateway_faults "{\"error_rate\":$e,\"lost_response_rate\":$l}"
  GATEWAY_CHANGES=$((GATEWAY_CHANGES + 1))
  say "chaos: fake gateway error_rate $e, lost_response_rate $l"
}
# chaos_action runs the next fault of a shuffled round of the four, so that
# each kind happens as often as the others.
CHAOS_ROUND=()
# shellcheck disable=SC2317
chaos_action() {
  ((${#CHAOS_ROUND[@]})) || mapfile -t CHAOS_ROUND < <(shuf -e chaos_kill chaos_drop chaos_db chaos_gateway)
  "${CHAOS_ROUND[0]}"
  CHAOS_ROUND=("${CHAOS_ROUND[@]:1}")
}

stack_up 2
# The publisher spans about 70% of the window, so the faults hit a steady load.
RATE=$(awk -v n="$ORDERS" -v d="$DURATION" 'BEGIN { printf "%.1f", n / (d * 0.7) }')
# The outbox relay's point is hit once a batch, not once a message: armed ten
# times as likely.
RELAY_P=$(awk -v p="$CRASH_P" 'BEGIN { printf "%g", p * 10 }')
ARMED="after-inbox-insert:$CRASH_P after-gateway-charge:$CRASH_P after-commit:$CRASH_P after-ack:$CRASH_P after-outbox-publish:$RELAY_P"
POINTS=five
if [[ $KIT_INBOX_MODE == buffered ]]; then
  ARMED+=" after-claim:$CRASH_P after-process-commit:$CRASH_P"
  POINTS=seven
fi
for ((i = 1; i <= REPLICAS; i++)); do set_crash_points "$i" "$ARMED"; done
gateway_faults '{"error_rate":0.05,"lost_response_rate":0.05}'
GATEWAY_CHANGES=1
publish_bg chaos -count "$ORDERS" -duplicate-rate 0.1 -republish-rate 0.05 -poison 20 -rate "$RATE" \
  -timeout "$((DURATION + 90))s"
say "chaos for ${DURATION}s: crash points armed (p=$CRASH_P each), a random fault every 2-5 s"
fault_loop "$DURATION" 2 5 chaos_action

say "stopping the faults"
disarm_all
gateway_faults '{"error_rate":0,"lost_response_rate":0,"latency":"0s"}'
supervise
note "${DURATION}s of chaos on two replicas ($KIT_INBOX_MODE inbox) while $ORDERS orders were published at $RATE/s (with duplicates, republishes and 20 poison messages)"
note "$CRASHES crashes at armed crash points (each of the $POINTS armed with probability $CRASH_P per message), $KILLS SIGKILLs; $RESTARTS restarts"
note "$DROPS times the broker closed every connection; $DB_ROUNDS times every session of the payments database was terminated ($DB_BACKENDS sessions)"
note "$GATEWAY_CHANGES settings of the gateway's 503 and lost-response rates"
# Bounded, so that a broken build fails within minutes: about 75 s in all for
# --duration 60s when every invariant holds, under 5 min when none does.
PUBLISH_TIMEOUT=90 wait_publishers
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-90} wait_drain

scenario_checks() {
  note "the gateway replayed $(report_value 'gateway replays served') stored results; the publisher reconnected $(summary_field reconnects) times"
  expect "replicas died and were restarted ($((CRASHES + KILLS)) deaths, $RESTARTS restarts)" gt "$RESTARTS" 0
  expect "the broker closed the connections ($DROPS times)" gt "$DROPS" 0
  expect "the database sessions were terminated ($DB_ROUNDS times)" gt "$DB_ROUNDS" 0
  expect "the gateway's fault rates changed ($GATEWAY_CHANGES times)" gt "$GATEWAY_CHANGES" 1
}
finish
