# shellcheck shell=bash
# lib.sh: what every fault script shares. Source it, then
#
#   kit_init SCENARIO "$@"      # mode, run directory, traps (local mode: the Go scenario)
#   stack_up                    # a clean Compose stack: fake gateway, two payment-service replicas
#   publish_bg NAME FLAGS...    # order-publisher in the background, summary in the run dir
#   ... cause the fault ...
#   wait_publishers; wait_drain
#   finish                      # inboxctl verify, the report, PASS/FAIL SCENARIO, exit 0/1
#
# Two modes, chosen on purpose (nothing is guessed from what the machine has):
#   local    (the default, or --local, STACK=local): kit_init runs the scenario's Go
#            version (kit/kittest/faultkit) with go test, as the service's test
#            of that name, and exits with its verdict: the service's replicas run as local
#            processes on the local RabbitMQ and PostgreSQL, in a fresh vhost and fresh
#            databases the test removes. FAULT_SERVICE=payment (default) or shipping
#            picks the service; the rest of the script is the Compose mode's.
#   compose  (--compose or STACK=compose): drives the Compose stack of the repository
#            (docker-compose.yml, plus docker-compose.override.yml if there is one, or
#            the files of COMPOSE_FILE, relative to the repository) under its own
#            project name (COMPOSE_PROJECT, default inbox-faults-<pid>) on fresh volumes, with
#            every *_HOST_PORT on a port Docker picks unless set in the environment,
#            so that it runs beside local servers and another stack. Addresses come
#            from `docker compose port`. The EXIT trap appends the containers' logs to
#            compose.log in the run directory and runs `down -v` unless KEEP=1.
#
# Every wait is bounded: a timeout fails the script. Settings (environment) of the
# Compose mode (the local mode's are the Go test's: docs/fault-kit.md):
#   KEEP=1                  keep the containers
#   COMPOSE_UP_LIMIT        seconds the stack may take to be healthy (default 600: see compose_up_wait)
#   STACK=local|compose     the mode (default local)
#   COMPOSE_PROJECT         compose project name (default inbox-faults-<pid>: runs never collide)
#   FAULTS_DIR              parent of the run directories (default ${TMPDIR:-/tmp}/inbox-faults)
#   RETRY_DELAYS MAX_ATTEMPTS RECONNECT_MAX_WAIT   passed to the service (short defaults: quick drains)
#   GATEWAY_IN_FLIGHT_TIMEOUT  the gateway's IN_FLIGHT_TAKEOVER and what the service is told of it
#                           (default 5s: the short retries, at least 8.96s, must outlast it)
#   INBOX_MODE              inline (default) or buffered: passed to the service; in buffered mode
#                           BUFFER_RETRY_DELAYS and BUFFER_MAX_ATTEMPTS too (short defaults), and a
#                           drain also waits for the buffered inbox's unprocessed messages

set -Eeuo pipefail

KIT_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
KIT_RETRY_DELAYS=${RETRY_DELAYS:-200ms,1s,2s}
KIT_MAX_ATTEMPTS=${MAX_ATTEMPTS:-8}
KIT_RECONNECT_MAX_WAIT=${RECONNECT_MAX_WAIT:-5s}
KIT_INBOX_MODE=${INBOX_MODE:-inline}
KIT_BUFFER_RETRY_DELAYS=${BUFFER_RETRY_DELAYS:-200ms,1s,2s}
KIT_BUFFER_MAX_ATTEMPTS=${BUFFER_MAX_ATTEMPTS:-30}
KIT_IN_FLIGHT=${GATEWAY_IN_FLIGHT_TIMEOUT:-5s}
KIT_CLUSTER=0 # 1: the Compose stack with the profile "cluster" (set by the script before stack_up)
COMPOSE_PROJECT=${COMPOSE_PROJECT:-inbox-faults-$$}

# State of one run.
SCENARIO=""
MODE=""
RUN_DIR=""
RUN_TAG=""
GATEWAY_ADDR=""
REPLICAS=0
SERVICE_SEEN=() # last instance seen by supervise: a container's start time
SERVICE_ARM=()  # crash points to arm after each (re)start: "POINT:P POINT:P"
SERVICE_HELD=() # 1 for a replica the scenario stopped on purpose (service_hold): not restarted
PUB_PIDS=()
PUB_NAMES=()
SUMMARIES=()
NOTES=()
CHECKS=()
CHECKS_FAILED=0
CRASHES=0      # replicas found dead (or restarted by Docker) that the script did not kill
KILLS=0        # replicas the script SIGKILLed itself
RESTARTS=0     # replicas the script started again
BROKER_STOPPED=0
BROKER_WATERMARK="" # set while a scenario's memory alarm is raised (alarm_on, alarm_off)
VERDICT_DONE=0
KIT_T0=$SECONDS

# ---------------------------------------------------------------- output

say() { printf '[%4ds] %s\n' "$((SECONDS - KIT_T0))" "$*"; }
warn() { printf '[%4ds] WARNING: %s\n' "$((SECONDS - KIT_T0))" "$*" >&2; }

# note adds a line to the "before" paragraph of the report: what the fault was.
note() { NOTES+=("$*"); }

# die ends the run: FAIL, with the reason and where the logs are.
die() {
  printf '\nerror: %s\n' "$*" >&2
  [[ -n $RUN_DIR ]] && printf 'logs: %s\n' "$RUN_DIR" >&2
  verdict FAIL
  exit 1
}

verdict() {
  VERDICT_DONE=1
  printf '%s took %ds\n' "$SCENARIO" "$((SECONDS - KIT_T0))"
  printf '%s %s\n' "$1" "$SCENARIO"
}

on_err() {
  printf "error: line %s: %s failed (exit %s)\n" "$1" "$2" "$3" >&2
}

usage_common() {
  cat <<EOF
usage: $0 [--local | --compose]

Runs the fault scenario "$SCENARIO" on a clean stack and checks the invariants with
inboxctl verify; prints PASS $SCENARIO or FAIL $SCENARIO and exits 0 or 1.
Modes: the scenario's Go version (go test) with local processes on the local
RabbitMQ and PostgreSQL (the default, --local; FAULT_SERVICE=payment|shipping,
INBOX_MODE=inline|buffered), or the Compose stack (--compose or STACK=compose).
KEEP=1 keeps the compose project for inspection.
Logs: \${TMPDIR:-/tmp}/inbox-faults/<scenario>-<timestamp>/.
EOF
}

# ---------------------------------------------------------------- set-up

# kit_init SCENARIO [--local|--compose|-h]: chooses the mode, makes the run
# directory and installs the traps.
kit_init() {
  SCENARIO=$1
  shift
  MODE=${STACK:-}
  local arg
  for arg in "$@"; do
    case $arg in
      --compose) MODE=compose ;;
      --local) MODE=local ;;
      -h | --help) usage_common; exit 0 ;;
      *) echo "unknown argument: $arg" >&2; usage_common >&2; exit 2 ;;
    esac
  done
  MODE=${MODE:-local}
  [[ $MODE == local || $MODE == compose ]] || { echo "STACK must be local or compose, got $MODE" >&2; exit 2; }
  RUN_TAG="$(date +%Y%m%d%H%M%S)-$$"
  RUN_DIR="${FAULTS_DIR:-${TMPDIR:-/tmp}/inbox-faults}/$SCENARIO-$RUN_TAG"
  mkdir -p "$RUN_DIR"
  trap 'on_err "$LINENO" "$BASH_COMMAND" "$?"' ERR
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  if [[ $MODE == local ]]; then
    go_scenario # gives the verdict and exits
  fi
  [[ ${FAULT_SERVICE:-payment} == payment ]] ||
    { echo "FAULT_SERVICE=$FAULT_SERVICE: Compose mode runs the payment stack only (local mode runs shipping too)" >&2; exit 2; }
  local tool
  for tool in curl timeout awk docker; do
    command -v "$tool" >/dev/null || die "$tool is needed"
  done
  say "$SCENARIO: $MODE mode, logs in $RUN_DIR"
}

# go_scenario runs the scenario's Go version, in local mode: the service's
# fault test (TestPaymentUnderFaults, TestShippingUnderFaults; Buffered with
# INBOX_MODE=buffered; the broker scenarios under -tags disruptive, chaos
# under -tags chaos) restricted to the scenario's subtest, with the race
# detector. Its output goes to the terminal and to go-test.txt in the run
# directory; PASS or FAIL SCENARIO follows.
go_scenario() {
  local service=${FAULT_SERVICE:-payment} pkg test tags="" name=$SCENARIO rc=0 timeout=30m
  case $service in
    payment) pkg=./internal/e2e test=TestPaymentUnderFaults ;;
    shipping) pkg=./examples/shipping test=TestShippingUnderFaults ;;
    *) echo "FAULT_SERVICE must be payment or shipping, got $service" >&2; exit 2 ;;
  esac
  [[ $KIT_INBOX_MODE == inline || $KIT_INBOX_MODE == buffered ]] ||
    { echo "INBOX_MODE must be inline or buffered, got $KIT_INBOX_MODE" >&2; exit 2; }
  case $SCENARIO in
    database-restart) name=database-sessions-terminated ;; # a shared server is not restarted
    broker-restart | broker-stop-outbox-backlog)
      [[ $service == payment ]] || skip "$SCENARIO runs against the payment service only"
      tags=disruptive test=TestDisruptivePaymentUnderBrokerFaults
      warn "this stops the local RabbitMQ (and may raise a memory alarm on it): every vhost and every other client of it is disturbed"
      # The test starts the broker again and clears the alarm at its end;
      # an interrupted run may not get there, so the EXIT trap checks.
      LOCAL_BROKER_DISTURBED=1
      LOCAL_WATERMARK=$(rmq -q eval 'vm_memory_monitor:get_vm_memory_high_watermark().' | tr -d '\r') ||
        die "rabbitmqctl eval failed: is the local broker up?"
      ;;
    broker-node-loss)
      [[ $service == payment ]] || skip "$SCENARIO runs against the payment service only"
      # The local three-node cluster (scripts/cluster.sh), started if it is
      # not up, left up (scripts/cluster.sh down removes it); the machine's
      # broker is not touched.
      tags=cluster test=TestPaymentOnCluster
      LOCAL_CLUSTER=1
      ;;
    chaos)
      [[ $service == payment ]] || skip "chaos runs against the payment service only"
      tags=chaos test=TestPaymentChaos timeout=$(((${CHAOS_DURATION%s} + 1200) / 60))m
      ;;
  esac
  [[ $KIT_INBOX_MODE == buffered ]] && test+=Buffered
  # GO_TEST_TIMEOUT, if set, replaces go test's -timeout: a caller that kills
  # the script at a limit of its own (CI) sets it below that limit, so that go
  # test fails first, with the test's own account of what it waited for.
  timeout=${GO_TEST_TIMEOUT:-$timeout}
  command -v go >/dev/null || die "go is needed in local mode"
  # The test's vhosts and databases are named <prefix>_<run>_…: this pid in the run's
  # name lets the EXIT trap, and scripts/faults-cleanup.sh later, tell this
  # run's leftovers.
  export TEST_RUN_ID=${TEST_RUN_ID:-faults$$}
  # The cleanups below match the prefix in grep and SQL: a bad one is
  # refused here, as the Go tests refuse it.
  [[ ${TEST_NAME_PREFIX:-t} =~ ^[a-z][a-z0-9]{0,11}$ ]] ||
    die "TEST_NAME_PREFIX='${TEST_NAME_PREFIX}': want a lowercase letter, then up to 11 lowercase letters and digits"
  say "$SCENARIO: local mode: go test -tags '$tags' -run '^$test\$/^$name\$' $pkg (output in $RUN_DIR/go-test.txt)"
  # In the background and in a process group of its own (setsid), so that a
  # signal to this script reaches its trap at once, and the trap can end the
  # test with every process it started.
  : >"$RUN_DIR/go-test.txt"
  (cd "$KIT_ROOT" && exec setsid go test -race -count=1 -v -timeout "$timeout" -tags "$tags" -run "^$test\$/^$name\$" "$pkg") \
    >"$RUN_DIR/go-test.txt" 2>&1 &
  GO_TEST_PID=$!
  tail -n +1 -f --pid="$GO_TEST_PID" "$RUN_DIR/go-test.txt" &
  wait "$GO_TEST_PID" || rc=$?
  GO_TEST_PID=""
  wait # the tail
  if ((rc == 0)) && ! grep -q -- "--- PASS: $test/$name " "$RUN_DIR/go-test.txt"; then
    skip "$test has no scenario $name in $KIT_INBOX_MODE mode: nothing ran"
  fi
  if ((rc == 0)); then verdict PASS; exit 0; fi
  echo "logs: $RUN_DIR"
  verdict FAIL
  exit 1
}

# skip ends a local-mode run that has nothing to run: SKIP SCENARIO, exit 3
# (make faults goes on to the next scenario; anything else stops it).
skip() {
  warn "$*"
  VERDICT_DONE=1
  printf 'SKIP %s\n' "$SCENARIO"
  exit 3
}

# local_cleanup is the EXIT trap's part in local mode. The Go test removes
# its own vhosts and databases and restores the broker, but a test ended by
# a signal runs no cleanup: then the trap ends its process group (go test,
# the test binary, the programs it started), removes the run's vhosts and
# databases by their names, and starts the broker again or clears the alarm
# a broker scenario may have left.
local_cleanup() {
  [[ -n ${GO_TEST_PID:-} ]] || return 0
  kill -KILL -- "-$GO_TEST_PID" 2>/dev/null
  wait "$GO_TEST_PID" 2>/dev/null
  if [[ $TEST_RUN_ID == "faults$$" ]]; then
    local vh db
    for vh in $(rmq -q list_vhosts name 2>/dev/null | grep "^${TEST_NAME_PREFIX:-t}_${TEST_RUN_ID}_"); do
      rmq -q delete_vhost "$vh" >/dev/null 2>&1
    done
    for db in $(timeout 30 psql -h "${PGHOST:-127.0.0.1}" -U "${PGUSER:-postgres}" -d postgres -Atqc \
      "SELECT datname FROM pg_database WHERE datname LIKE '${TEST_NAME_PREFIX:-t}\_${TEST_RUN_ID}\_%'" 2>/dev/null); do
      timeout 30 psql -h "${PGHOST:-127.0.0.1}" -U "${PGUSER:-postgres}" -d postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1
    done
    say "interrupted: the run's processes ended, its vhosts and databases removed"
  fi
  if ((${LOCAL_CLUSTER:-0})); then
    local vh
    # The test's own cleanup did not run: start the node it may have left
    # killed, and remove its vhost from the cluster.
    timeout 180 bash "$KIT_ROOT/scripts/cluster.sh" up >/dev/null 2>&1 || warn "scripts/cluster.sh up failed: see scripts/cluster.sh status"
    if [[ $TEST_RUN_ID == "faults$$" ]]; then
      for vh in $(timeout 60 bash "$KIT_ROOT/scripts/cluster.sh" ctl list_vhosts name 2>/dev/null | grep "^${TEST_NAME_PREFIX:-t}_${TEST_RUN_ID}_"); do
        timeout 60 bash "$KIT_ROOT/scripts/cluster.sh" ctl delete_vhost "$vh" >/dev/null 2>&1
      done
    fi
  fi
  ((${LOCAL_BROKER_DISTURBED:-0})) || return 0
  if ! rmq -q await_startup --timeout 5 >/dev/null 2>&1; then
    warn "the local broker was left stopped: starting it again"
    rmq -q start_app >/dev/null && rmq -q await_startup --timeout 120 >/dev/null
  fi
  if [[ -n ${LOCAL_WATERMARK:-} ]] && rmq -q eval 'rabbit_alarm:get_alarms().' 2>/dev/null | grep -q memory; then
    warn "a memory alarm was left raised: restoring the watermark $LOCAL_WATERMARK"
    if [[ $LOCAL_WATERMARK =~ ^\{absolute,([0-9]+)\}$ ]]; then
      rmq -q set_vm_memory_high_watermark absolute "${BASH_REMATCH[1]}" >/dev/null
    else
      rmq -q set_vm_memory_high_watermark "$LOCAL_WATERMARK" >/dev/null
    fi
  fi
}

# rmq: rabbitmqctl on the local broker (local mode), bounded.
rmq() { timeout 60 "${RABBITMQCTL_CMD[@]}" "$@"; }
read -r -a RABBITMQCTL_CMD <<<"${RABBITMQCTL:-rabbitmqctl}"

# cleanup is the EXIT trap: no process of ours survives the script.
cleanup() {
  local rc=$?
  trap - ERR
  set +e
  if ((VERDICT_DONE == 0)); then
    printf 'FAIL %s (stopped with exit %s; logs in %s)\n' "$SCENARIO" "$rc" "$RUN_DIR"
    ((rc == 0)) && rc=1
  fi
  if [[ $MODE == local ]]; then
    local_cleanup
    exit "$rc"
  fi
  if ((BROKER_STOPPED)); then
    warn "the broker was left stopped: starting it again"
    broker_start_app
  fi
  if [[ -n $BROKER_WATERMARK ]]; then
    warn "a memory alarm was left raised: restoring the watermark $BROKER_WATERMARK"
    broker_ctl -q set_vm_memory_high_watermark "$BROKER_WATERMARK" >/dev/null
  fi
  local pid
  for pid in "${PUB_PIDS[@]}"; do
    disown "$pid" 2>/dev/null # no "Killed" job notice
    kill -TERM "$pid" 2>/dev/null
  done
  {
    echo "=== containers' logs at exit ($(date -Is))"
    compose logs --no-color --timestamps
  } >>"$RUN_DIR/compose.log" 2>&1
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "KEEP=1: the compose project $COMPOSE_PROJECT is still up; remove it with"
    echo "  (cd $KIT_ROOT && docker compose -p $COMPOSE_PROJECT --profile cluster down -v)"
  else
    compose_down
  fi
  exit "$rc"
}

# compose runs docker compose in the repository, so that it reads the files a
# user's own `docker compose` there would: COMPOSE_FILE, or docker-compose.yml
# and docker-compose.override.yml, and .env.
compose() { (cd "$KIT_ROOT" && timeout 900 docker compose -p "$COMPOSE_PROJECT" "$@"); }


# compose_up_wait [UP-FLAG…] -- SERVICE…: docker compose up -d --wait of the
# services, patient with a busy machine. --wait gives up at the first
# container Docker calls unhealthy (three probes failed in a row, a few
# seconds each: a machine busy with other work makes that of a container that
# is only slow), so the up is asked again after that answer, and only after
# it, while no container has exited or restarted (a crash, with the
# services' restart policy), for up to COMPOSE_UP_LIMIT seconds (default
# 600, far beyond the 30 to 90 s it takes). Any other failure (the
# configuration, an image, a port) fails the run at once. A failure prints
# each container's state and its health probe's last answers, which the
# compose log alone does not have.
compose_up_wait() {
  local flags=() services=() out crashed left deadline=$((SECONDS + ${COMPOSE_UP_LIMIT:-600})) tries=0
  while (($#)) && [[ $1 != -- ]]; do flags+=("$1"); shift; done
  (($#)) && shift
  services=("$@")
  while true; do
    left=$((deadline - SECONDS))
    ((left > 300)) && left=300
    ((left < 10)) && left=10
    tries=$((tries + 1))
    out=$(compose "${flags[@]}" up -d --wait --wait-timeout "$left" "${services[@]}" 2>&1) && break
    printf '%s\n' "$out" >>"$RUN_DIR/compose.log"
    crashed=$(compose "${flags[@]}" ps -a --format '{{.Service}} {{.State}} {{.ExitCode}}' "${services[@]}" 2>>"$RUN_DIR/compose.log" |
      awk '$2 == "exited" || $2 == "dead" || $2 == "restarting" { print $1 }' | sort -u | tr '\n' ' ') || true
    if [[ -z $crashed ]]; then
      local c
      for c in $(compose "${flags[@]}" ps -a -q "${services[@]}" 2>/dev/null || true); do
        if (($(docker inspect --format '{{.RestartCount}}' "$c" 2>/dev/null || echo 0) > 0)); then
          crashed+="$(docker inspect --format '{{.Name}}' "$c" 2>/dev/null || echo "$c") "
        fi
      done
    fi
    # Compose's words (v2.40, pkg/compose): "container X is unhealthy",
    # "dependency failed to start: …", and "application not healthy after
    # 5m0s" when --wait-timeout ran out with a container still starting.
    if [[ -n $crashed ]] || ! grep -qE 'is unhealthy|dependency failed to start|not healthy after' <<<"$out" || ((SECONDS >= deadline)); then
      printf '%s\n' "$out" | tail -n 20 >&2
      compose_health_report "${flags[@]}" -- "${services[@]}"
      die "docker compose up failed (try $tries${crashed:+; exited or restarted: ${crashed% }}; see $RUN_DIR/compose.log)"
    fi
    warn "docker compose up --wait: a container is not healthy yet (try $tries); asking again"
    sleep 5
  done
}

# compose_health_report [UP-FLAG…] -- SERVICE…: to stderr, each container's
# state and health, and the last answers of the health probe of each that is
# not healthy. It never fails: it only reports.
compose_health_report() {
  local flags=() c
  while (($#)) && [[ $1 != -- ]]; do flags+=("$1"); shift; done
  (($#)) && shift
  {
    echo "containers:"
    compose "${flags[@]}" ps -a --format '  {{.Name}}: {{.State}} {{.Health}} (exit {{.ExitCode}}; {{.Status}})' "$@" || true
    for c in $(compose "${flags[@]}" ps -a -q "$@" || true); do
      case $(docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$c" 2>/dev/null || true) in
        "" | healthy) continue ;;
      esac
      printf '%s, its last health probes:\n' "$(docker inspect --format '{{.Name}}' "$c" 2>/dev/null || echo "$c")"
      docker inspect --format '{{range .State.Health.Log}}  exit {{.ExitCode}}: {{.Output}}{{println}}{{end}}' "$c" 2>/dev/null || true
    done
  } >&2
}

# wait_until SECONDS WHAT CMD...: polls CMD every second; fails the run on timeout.
wait_until() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what"
    sleep 1
  done
}


http_ok() { curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null; }


# stack_up: the Compose stack, clean (its two payment-service replicas).
stack_up() {
  compose_up
}



# compose_down removes the project, its volumes and its network. A container
# of `docker compose run` (the publisher, inboxctl) survives its client's
# SIGTERM and `down --remove-orphans` while it runs, and would keep the network,
# and publish into the next run's broker: those go first.
compose_down() {
  local oneoffs
  oneoffs=$(docker ps -q --filter "label=com.docker.compose.project=${COMPOSE_PROJECT,,}" \
    --filter label=com.docker.compose.oneoff=True) || true
  if [[ -n $oneoffs ]]; then
    # shellcheck disable=SC2086 # one id a word
    docker rm -f $oneoffs >>"$RUN_DIR/compose.log" 2>&1
  fi
  compose --profile cluster down -v --remove-orphans >>"$RUN_DIR/compose.log" 2>&1
}

# compose_up: the stack on fresh volumes, built from the working tree (BuildKit
# reuses every cached layer, so a rebuild of unchanged code takes a second or
# two), without Prometheus, which no scenario needs.
compose_up() {
  command -v docker >/dev/null || die "docker is needed in compose mode"
  # The compose file passes these through to the services and to inboxctl.
  export RETRY_DELAYS="$KIT_RETRY_DELAYS" MAX_ATTEMPTS="$KIT_MAX_ATTEMPTS" RECONNECT_MAX_WAIT="$KIT_RECONNECT_MAX_WAIT" \
    GATEWAY_IN_FLIGHT_TIMEOUT="$KIT_IN_FLIGHT" IN_FLIGHT_TAKEOVER="$KIT_IN_FLIGHT"
  export INBOX_MODE="$KIT_INBOX_MODE" BUFFER_RETRY_DELAYS="$KIT_BUFFER_RETRY_DELAYS" BUFFER_MAX_ATTEMPTS="$KIT_BUFFER_MAX_ATTEMPTS"
  # Host ports Docker picks (0), unless the environment sets them: never the
  # ones of a local PostgreSQL or RabbitMQ, or of another stack.
  export RABBITMQ_HOST_PORT=${RABBITMQ_HOST_PORT:-0} RABBITMQ_UI_HOST_PORT=${RABBITMQ_UI_HOST_PORT:-0} \
    POSTGRES_HOST_PORT=${POSTGRES_HOST_PORT:-0} GATEWAY_HOST_PORT=${GATEWAY_HOST_PORT:-0} \
    PROMETHEUS_HOST_PORT=${PROMETHEUS_HOST_PORT:-0} CARRIER_HOST_PORT=${CARRIER_HOST_PORT:-0}
  say "compose project $COMPOSE_PROJECT on fresh volumes"
  printf '=== %s: %s\n' "$(date -Is)" "compose_up" >>"$RUN_DIR/compose.log"
  compose_down || true
  compose build fake-gateway payment-service order-publisher inboxctl fake-carrier shipping-service >>"$RUN_DIR/compose.log" 2>&1 ||
    die "docker compose build failed (see $RUN_DIR/compose.log)"
  # The pipeline's second half too: the payment service's events need the
  # shipping service's queue, and verify checks the chain.
  local profile=() nodes
  [[ $KIT_CLUSTER == 1 ]] && profile=(--profile cluster)
  read -r -a nodes <<<"$(broker_nodes)"
  compose_up_wait "${profile[@]}" -- "${nodes[@]}" postgres fake-gateway payment-service fake-carrier shipping-service
  REPLICAS=2 # the compose file runs two
  GATEWAY_ADDR=$(compose port fake-gateway 8081 2>>"$RUN_DIR/compose.log" | tail -n1)
  [[ -n $GATEWAY_ADDR ]] || die "docker compose port fake-gateway 8081 gave no address"
  local i
  for ((i = 1; i <= REPLICAS; i++)); do
    SERVICE_SEEN[i]=$(service_instance "$i")
    service_wait "$i" 60
  done
  say "stack up: fake-gateway $GATEWAY_ADDR, payment-service ×$REPLICAS ($KIT_INBOX_MODE inbox) on $(service_addrs), shipping-service and fake-carrier"
}

# ---------------------------------------------------------------- payment-service replicas

# service_container I prints the id of replica I's container, found by
# Compose's labels (whatever names an override gives the containers).
service_container() {
  docker ps -aq --filter "label=com.docker.compose.project=${COMPOSE_PROJECT,,}" \
    --filter label=com.docker.compose.service=payment-service \
    --filter "label=com.docker.compose.container-number=$1" --filter label=com.docker.compose.oneoff=False |
    head -n1
}

# service_addr I prints host:port of replica I (compose maps a new port after a
# restart), or nothing while its container has none (Docker is restarting it).
service_addr() {
  compose port --index "$1" payment-service 8080 2>/dev/null | tail -n1 || true
}

service_addrs() {
  local i out=""
  for ((i = 1; i <= REPLICAS; i++)); do out+="$(service_addr "$i") "; done
  echo "${out% }"
}

# service_instance I prints what identifies the running process of replica I
# (its container's start time), "restarting" while Docker's restart policy
# brings the container back, or "dead".
service_instance() {
  local state
  state=$(docker inspect -f '{{.State.Restarting}} {{.State.Running}} {{.State.StartedAt}}' \
    "$(service_container "$1")" 2>/dev/null) || state=""
  case $state in
    true*) echo restarting ;; # Docker reports a restarting container as running too
    "false true "*) echo "${state#false true }" ;;
    *) echo dead ;;
  esac
}

service_alive() { [[ $(service_instance "$1") != dead ]]; }

# service_start I [PROBE]: starts replica I, waits until PROBE answers 200
# (readyz by default: consuming and the database answers; the supervisor uses
# healthz, as a real one would not wait for readiness either), then arms the
# crash points set for it with set_crash_points.
service_start() {
  local i=$1 probe=${2:-readyz}
  docker start "$(service_container "$i")" >/dev/null || die "docker start $(service_container "$i") failed"
  service_wait "$i" 60 "$probe"
  SERVICE_SEEN[i]=$(service_instance "$i")
  arm_replica "$i"
}

service_probe() { service_alive "$1" && http_ok "http://$(service_addr "$1")/$2"; }

# service_wait I SECONDS [PROBE]: /PROBE (readyz by default) answers 200, or the run fails.
service_wait() {
  local i=$1 limit=$2 probe=${3:-readyz}
  local deadline=$((SECONDS + limit))
  until service_probe "$i" "$probe"; do
    ((SECONDS < deadline)) || die "payment-service replica $i: /$probe not 200 within ${limit}s"
    sleep 0.5
  done
}

# service_kill I: SIGKILL, as an OOM killer or a power cut would.
service_kill() {
  local i=$1
  docker kill -s KILL "$(service_container "$i")" >/dev/null 2>&1 || true
  SERVICE_SEEN[i]=dead
  KILLS=$((KILLS + 1))
}

# supervise does what a real supervisor (systemd, Kubernetes, Docker's restart
# policy) does: every replica that died is started again, and re-armed. A death
# the script did not cause itself counts as a crash.
supervise() {
  local i now
  for ((i = 1; i <= REPLICAS; i++)); do
    ((${SERVICE_HELD[i]:-0})) && continue
    now=$(service_instance "$i")
    [[ $now != dead && $now == "${SERVICE_SEEN[i]:-}" ]] && continue
    [[ ${SERVICE_SEEN[i]:-dead} != dead ]] && CRASHES=$((CRASHES + 1))
    SERVICE_SEEN[i]=dead
    if [[ $now == dead ]]; then
      RESTARTS=$((RESTARTS + 1))
      service_start "$i" healthz
    else
      # compose: Docker's restart policy is bringing it back by itself.
      service_wait "$i" 90 healthz
      SERVICE_SEEN[i]=$(service_instance "$i")
      arm_replica "$i"
    fi
  done
}

# supervise_for SECONDS: keeps the replicas up for that long.
supervise_for() {
  local deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    supervise
    sleep 0.5
  done
}

# fault_loop SECONDS MIN MAX ACTION...: for SECONDS, runs ACTION every MIN to MAX
# seconds (at random), keeping the replicas up in between.
fault_loop() {
  local secs=$1 min=$2 max=$3
  shift 3
  local end=$((SECONDS + secs)) next=$((SECONDS + min + RANDOM % (max - min + 1)))
  while ((SECONDS < end)); do
    supervise
    if ((SECONDS >= next)); then
      "$@"
      next=$((SECONDS + min + RANDOM % (max - min + 1)))
    fi
    sleep 0.5
  done
}

# fault_rounds N MIN MAX CMD...: runs CMD N times, MIN-MAX seconds apart,
# supervising in between: a count, not a duration, so that a loaded machine
# (slow kills and restarts) still gets every round.
fault_rounds() {
  local n=$1 min=$2 max=$3 i next
  shift 3
  for ((i = 0; i < n; i++)); do
    next=$((SECONDS + min + RANDOM % (max - min + 1)))
    while ((SECONDS < next)); do
      supervise
      sleep 0.5
    done
    "$@"
  done
}

# random_replica prints a replica number.
random_replica() { echo $((1 + RANDOM % REPLICAS)); }

# ---------------------------------------------------------------- crash points

# set_crash_points I "POINT:P ...": what replica I arms now and after each restart
# (empty: nothing).
set_crash_points() {
  SERVICE_ARM[$1]=$2
  service_alive "$1" && arm_replica "$1"
  return 0
}

# faults_token I prints the FAULTS_TOKEN replica I runs with (its container's
# environment: docker-compose.yml's default or the one .env sets).
faults_token() {
  docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$(service_container "$1")" 2>/dev/null |
    sed -n 's/^FAULTS_TOKEN=//p'
}

arm_replica() {
  local i=$1 spec addr auth
  addr=$(service_addr "$i")
  [[ -n $addr ]] || return 0 # restarting: supervise arms it once it is back
  auth="Authorization: Bearer $(faults_token "$i")"
  curl -fsS -o /dev/null --max-time 5 -H "$auth" -X DELETE "http://$addr/faults/crash" 2>/dev/null || return 0
  for spec in ${SERVICE_ARM[i]:-}; do
    curl -fsS -o /dev/null --max-time 5 -H "$auth" -X POST "http://$addr/faults/crash?at=${spec%%:*}&probability=${spec##*:}" ||
      warn "could not arm $spec on replica $i"
  done
}

# disarm_all clears every crash point, now and for later restarts.
disarm_all() {
  local i
  for ((i = 1; i <= REPLICAS; i++)); do set_crash_points "$i" ""; done
}

# crash_phase POINT PROBABILITY SECONDS [MIN_CRASHES]: arms POINT on every
# replica, restarts each replica that kills itself (and arms it again), then
# disarms. It stays armed for SECONDS, and longer while a publisher still runs
# and fewer than MIN_CRASHES (default 3) crashes were seen.
crash_phase() {
  local point=$1 p=$2 secs=$3 want=${4:-3} i before=$CRASHES start=$SECONDS
  say "arming crash point $point with probability $p on every replica; restarting each replica that dies"
  for ((i = 1; i <= REPLICAS; i++)); do set_crash_points "$i" "$point:$p"; done
  supervise_for "$secs"
  while ((CRASHES - before < want)) && publishers_running; do
    supervise
    sleep 0.5
  done
  disarm_all
  supervise
  say "disarmed after $((SECONDS - start))s: $((CRASHES - before)) crashes at $point, each replica restarted"
  note "payment-service killed itself $((CRASHES - before)) times at $point (armed with probability $p on each message for $((SECONDS - start))s) and was restarted each time"
}

# ---------------------------------------------------------------- gateway

# gateway_faults JSON: POST /faults on the fake gateway (error_rate, lost_response_rate, latency).
gateway_faults() {
  # Docker maps a new host port if it restarted the container.
  GATEWAY_ADDR=$(compose port fake-gateway 8081 2>/dev/null | tail -n1) || true
  local token
  token=$(docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$(compose ps -q fake-gateway)" 2>/dev/null |
    sed -n 's/^FAULTS_TOKEN=//p')
  curl -fsS -o /dev/null --max-time 5 -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $token" -d "$1" \
    "http://$GATEWAY_ADDR/faults" || die "POST /faults $1 to the fake gateway failed"
}

# ---------------------------------------------------------------- broker and database

# broker_ctl ARGS...: rabbitmqctl on the run's broker.
# broker_ctl runs rabbitmqctl in the broker's container; with the profile
# "cluster" (KIT_CLUSTER=1) in the first node that answers.
broker_ctl() {
  local node
  for node in $(broker_nodes); do
    if [[ $KIT_CLUSTER != 1 ]] || compose exec -T "$node" rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
      compose exec -T "$node" rabbitmqctl "$@"
      return
    fi
  done
  warn "no broker node answers"
  return 1
}

# broker_nodes prints the broker's Compose services: rabbitmq, and with the
# profile "cluster" rabbitmq-2 and rabbitmq-3.
broker_nodes() {
  if [[ $KIT_CLUSTER == 1 ]]; then echo rabbitmq rabbitmq-2 rabbitmq-3; else echo rabbitmq; fi
}

# queue_leader Q prints the Compose service of the node leading quorum queue
# Q, nothing during an election.
queue_leader() {
  broker_ctl -q list_queues --no-table-headers name leader 2>/dev/null |
    awk -v q="$1" '$1 == q && $2 ~ /^rabbit@/ { sub(/^rabbit@/, "", $2); print $2 }'
}

# node_kill SERVICE: SIGKILL to a broker node's container (Docker's restart
# policy leaves a killed container down); node_start SERVICE starts it again
# and waits until it is healthy.
node_kill() { docker kill -s KILL "$(compose ps -q "$1")" >/dev/null; }
node_start() {
  compose start "$1" >/dev/null 2>&1 && compose up -d --wait "$1" >/dev/null 2>&1
}

# close_connections: the broker closes every connection of the run's vhost
# (the service's and the publisher's).
close_connections() {
  broker_ctl -q close_all_connections -p / "fault script $SCENARIO" >/dev/null ||
    warn "close_all_connections failed"
}

broker_stop_app() {
  BROKER_STOPPED=1
  compose stop rabbitmq >/dev/null 2>&1
}

broker_start_app() {
  compose start rabbitmq >/dev/null 2>&1 && compose up -d --wait rabbitmq >/dev/null 2>&1 && BROKER_STOPPED=0
}

# service_hold I stops replica I (SIGKILL) and keeps it stopped: supervise
# does not restart it until service_release I starts it again.
service_hold() {
  SERVICE_HELD[$1]=1
  service_kill "$1"
}
service_release() {
  service_start "$1"
  SERVICE_HELD[$1]=0
}

# alarm_on raises a memory alarm on the broker: every connection that
# publishes blocks. alarm_off clears it; the cleanup does if a scenario died.
alarm_on() {
  BROKER_WATERMARK=$(broker_ctl -q eval 'vm_memory_monitor:get_vm_memory_high_watermark().' | tr -d '\r')
  broker_ctl -q set_vm_memory_high_watermark 0.000001 >/dev/null
  # The memory monitor raises the alarm at its next check, not at once.
  wait_until 30 "the broker's memory alarm" alarm_raised
}
alarm_raised() { broker_ctl -q eval 'rabbit_alarm:get_alarms().' 2>/dev/null | grep -q memory; }
alarm_off() {
  [[ -n $BROKER_WATERMARK ]] || return 0
  broker_ctl -q set_vm_memory_high_watermark "$BROKER_WATERMARK" >/dev/null && BROKER_WATERMARK=""
}

# queue_depths prints "queue messages unacked" for every queue of the run.
queue_depths() {
  broker_ctl -s list_queues -p / name messages messages_unacknowledged
}

# pending_messages prints how many messages wait in, or are being handled from,
# the work and retry queues of both services (the dead-letter queues are not
# counted), plus the payment service's events not yet confirmed (its outbox).
pending_messages() {
  local out queued stored=0 unsent
  out=$(queue_depths 2>/dev/null) || return 1
  [[ -n $out ]] || return 1
  queued=$(awk '$1 !~ /\.dlq$/ { n += $2 + $3 } END { print n + 0 }' <<<"$out")
  if [[ $KIT_INBOX_MODE == buffered ]]; then # stored and acked, not yet processed
    stored=$(psql_payments "SELECT count(*) FROM inbox_messages WHERE status IN ('pending', 'processing', 'failed')") || return 1
  fi
  unsent=$(psql_payments "SELECT count(*) FROM outbox WHERE status = 'pending'") || return 1
  echo $((queued + stored + unsent))
}

# psql_payments SQL: one query on the payments database, unaligned output.
psql_payments() { compose exec -T postgres psql -U postgres -d payments -Atqc "$1"; }

payments_count() { psql_payments "SELECT count(*) FROM payments"; }

# kill_db_backends: pg_terminate_backend on every session of the payments
# database; prints how many. The cluster itself keeps running (it is shared).
kill_db_backends() {
  compose exec -T postgres psql -U postgres -d postgres -Atqc \
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'payments' AND pid <> pg_backend_pid()"
}

# ---------------------------------------------------------------- publisher

# publish_bg NAME FLAGS...: starts order-publisher with a run id of its own and
# a summary file for verify.
publish_bg() {
  local name=$1
  shift
  local run_id="${SCENARIO}-${RUN_TAG}-$name"
  local summary="summary-$name.json"
  SUMMARIES+=("$summary")
  PUB_NAMES+=("$name")
  say "publishing ($name): order-publisher $*"
  compose run --rm -T --no-deps --user "$(id -u):$(id -g)" -v "$RUN_DIR:/kit" order-publisher \
    -run-id "$run_id" -summary "/kit/$summary" -timeout 5m "$@" \
    >"$RUN_DIR/publisher-$name.txt" 2>"$RUN_DIR/publisher-$name.log" &
  PUB_PIDS+=($!)
}

publishers_running() {
  local pid
  for pid in "${PUB_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null && return 0
  done
  return 1
}

# wait_publishers: every publisher exits 0 (all confirmed) within
# PUBLISH_TIMEOUT seconds (default 360), while the replicas are kept up.
wait_publishers() {
  local limit=${PUBLISH_TIMEOUT:-360} deadline k rc
  deadline=$((SECONDS + limit))
  while publishers_running; do
    ((SECONDS < deadline)) || die "order-publisher still running after ${limit}s"
    supervise
    sleep 0.5
  done
  for k in "${!PUB_PIDS[@]}"; do
    rc=0
    wait "${PUB_PIDS[k]}" || rc=$?
    if ((rc != 0)); then
      tail -n 20 "$RUN_DIR/publisher-${PUB_NAMES[k]}.txt" "$RUN_DIR/publisher-${PUB_NAMES[k]}.log" >&2
      die "order-publisher (${PUB_NAMES[k]}) exited $rc"
    fi
    say "published (${PUB_NAMES[k]}): $(summary_text "$RUN_DIR/summary-${PUB_NAMES[k]}.json")"
  done
  PUB_PIDS=()
  PUB_NAMES=()
}

# summary_text FILE: what one publisher sent, from its summary.
summary_text() {
  awk -F'[:,]' '
    /"orders":/ { o += $2 } /"published":/ { p += $2 } /"duplicates":/ { d += $2 }
    /"republishes":/ { r += $2 } /"poison_total":/ { x += $2 } /"republished_after_reconnect":/ { a += $2 }
    END { printf "%d orders in %d messages (%d duplicates, %d republishes, %d poison; %d sent again after a reconnect)", o, p, d, r, x, a }
  ' "$1"
}

# summary_field FIELD: the sum of a numeric field over the summaries.
summary_field() {
  local f files=()
  for f in "${SUMMARIES[@]}"; do files+=("$RUN_DIR/$f"); done
  awk -F'[:,]' -v k="\"$1\"" '$1 ~ k { n += $2 } END { print n + 0 }' "${files[@]}"
}

# ---------------------------------------------------------------- drain and verify

# wait_drain: the work and retry queues are empty and the payments count has
# not moved over three polls a few seconds apart, within DRAIN_TIMEOUT seconds
# (default 240). Replicas that die meanwhile are restarted.
wait_drain() {
  local limit=${DRAIN_TIMEOUT:-240} deadline pending paid last_paid=-1 quiet=0
  deadline=$((SECONDS + limit))
  say "waiting for the queues to drain (at most ${limit}s)"
  while :; do
    supervise
    pending=$(pending_messages) || pending=unknown
    paid=$(payments_count 2>/dev/null) || paid=unknown
    if [[ $pending == 0 && $paid == "$last_paid" ]]; then
      quiet=$((quiet + 1))
    else
      quiet=0
    fi
    ((quiet >= 2)) && break
    last_paid=$paid
    if ((SECONDS >= deadline)); then
      # Not fatal here: verify still runs, so the report shows what is missing.
      warn "queues not drained after ${limit}s ($pending messages pending, $paid payments):"
      queue_depths >&2 || true
      note "the queues did not drain within ${limit}s after the fault"
      CHECKS+=("FAIL  the queues drained within ${limit}s")
      CHECKS_FAILED=1
      return 0
    fi
    sleep 1
  done
  say "drained: $paid payments, work and retry queues empty"
}

# run_verify: inboxctl verify on every summary at once (one table over all
# the runs); the report goes to verify.txt.
run_verify() {
  local f args=()
  for f in "${SUMMARIES[@]}"; do args+=(--summary "/kit/$f"); done
  VERIFY_RC=0
  compose run --rm -T --no-deps --user "$(id -u):$(id -g)" -v "$RUN_DIR:/kit" inboxctl verify "${args[@]}" \
    >"$RUN_DIR/verify.txt" 2>&1 || VERIFY_RC=$?
}

# report_value LABEL: a number from the verify table, e.g. "gateway replays
# served".
report_value() {
  awk -v k="$1" '{ sub(/^ +/, "") } index($0, k) == 1 && substr($0, length(k) + 1) ~ /^ +[0-9]+$/ { v = $NF } END { print v }' \
    "$RUN_DIR/verify.txt"
}

# expect WHAT CMD...: a check of the scenario itself (that the fault happened and
# had its visible effect), reported under the verify table.
expect() {
  local what=$1
  shift
  if "$@"; then
    CHECKS+=("PASS  $what")
  else
    CHECKS+=("FAIL  $what")
    CHECKS_FAILED=1
  fi
}

gt() { [[ $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ ]] && (($1 > $2)); }
eq() { [[ $1 == "$2" ]]; }

# service_logs: every line the replicas logged in this run, across restarts.
service_logs() {
  compose logs --no-color --no-log-prefix "${1:-payment-service}" 2>/dev/null
}

# count_logged TEXT...: lines of the replicas' logs containing every TEXT.
count_logged() {
  local lines pattern
  lines=$(service_logs "${LOGS_OF:-payment-service}") || true
  for pattern in "$@"; do
    lines=$(grep -F -- "$pattern" <<<"$lines") || true
  done
  if [[ -z $lines ]]; then echo 0; else wc -l <<<"$lines" | tr -d ' '; fi
}

# metric_sum SERIES: the sum over the live replicas (a replica's counters
# start again from zero when it restarts) of every sample of a metric whose
# labels include those SERIES names: 'consumer_pauses_total{consumer="x"}'
# sums the pauses of every cause.
metric_sum() {
  local i n page total=0
  for ((i = 1; i <= REPLICAS; i++)); do
    page=$(curl -fsS --max-time 5 "http://$(service_addr "$i")/metrics" 2>/dev/null) || page=""
    n=$(series_sum "$1" <<<"$page")
    total=$((total + n))
  done
  echo "$total"
}

# series_sum SERIES: reads a /metrics page on stdin and prints the sum of the
# samples of SERIES's metric that carry each of its label pairs (an integer).
series_sum() {
  awk -v s="$1" '
    BEGIN {
      name = s; sub(/\{.*/, "", name)
      want = ""; if (index(s, "{")) { want = substr(s, index(s, "{") + 1); sub(/\}$/, "", want) }
      n = split(want, pairs, ",")
    }
    /^#/ { next }
    {
      metric = $1; sub(/\{.*/, "", metric)
      if (metric != name) next
      for (i = 1; i <= n; i++) if (index($1, pairs[i]) == 0) next
      sum += $NF
    }
    END { printf "%d\n", sum }'
}

# replicas_consuming: after the drain every replica must be consuming again
# (/readyz 200 within 120 s). A replica that is alive but wedged hides behind a
# healthy one: the queues drain, and only this check notices. (30 s failed a
# Compose run under a CPU hog, where each probe runs docker compose port and
# docker inspect before its request: a deadline far beyond need, not a margin.)
replicas_consuming() {
  local i deadline
  for ((i = 1; i <= REPLICAS; i++)); do
    deadline=$((SECONDS + 120))
    until service_probe "$i" readyz || ((SECONDS >= deadline)); do sleep 1; done
    if ! service_probe "$i" readyz; then
      # What the replica says of itself: its checks, or why it answers none.
      say "replica $i: alive: $(service_alive "$i" && echo yes || echo no); address: $(service_addr "$i" 2>&1); /readyz: $(curl -sS --max-time 5 "http://$(service_addr "$i" 2>/dev/null)/readyz" 2>&1 | head -c 600)"
    fi
    expect "replica $i is consuming again at the end (/readyz 200)" service_probe "$i" readyz
  done
}

# finish: verify, then the report: what the fault was, the verify table, the
# scenario's own checks (the function scenario_checks, if the script defines
# one, runs after verify and calls expect), and PASS or FAIL with the exit code.
finish() {
  replicas_consuming
  say "inboxctl verify"
  run_verify
  if declare -F scenario_checks >/dev/null; then scenario_checks; fi
  echo
  echo "before verify, the fault was:"
  local line
  for line in "${NOTES[@]}"; do echo "  - $line"; done
  echo
  cat "$RUN_DIR/verify.txt"
  if ((${#CHECKS[@]})); then
    echo
    echo "scenario checks:"
    for line in "${CHECKS[@]}"; do echo "$line"; done
  fi
  echo
  if ((VERIFY_RC == 0 && CHECKS_FAILED == 0)); then
    verdict PASS
    exit 0
  fi
  echo "logs: $RUN_DIR"
  verdict FAIL
  exit 1
}
