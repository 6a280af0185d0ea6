#!/usr/bin/env bash
# cluster.sh: a three-node RabbitMQ cluster of this machine's own server, for
# tests and trials, without Docker. The nodes have their own node names
# (cluster1@localhost …), ports (AMQP 5681-5683, distribution 25681-25683),
# data and log directories ($CLUSTER_DIR), configuration and no plugins: the
# machine's default broker (rabbit@localhost, 5672, 15672) is left alone.
#
#   scripts/cluster.sh up        start the three nodes, join 2 and 3 to 1, print one AMQP URL per node
#   scripts/cluster.sh urls      print the URLs again
#   scripts/cluster.sh status    the cluster's view (rabbitmqctl cluster_status on a live node)
#   scripts/cluster.sh kill N    SIGKILL node N (1-3): a crash, not a stop
#   scripts/cluster.sh leader VHOST QUEUE  the node (1-3) that leads QUEUE, 0 if none does
#   scripts/cluster.sh start N   start node N again (it rejoins with its data)
#   scripts/cluster.sh ctl ARG…  rabbitmqctl ARG… on the first live node (the next if it dies meanwhile)
#   scripts/cluster.sh down      stop every node and remove $CLUSTER_DIR
#
# Needs root (the nodes run as the rabbitmq user, with its Erlang cookie) and
# Debian's rabbitmq-server package. CLUSTER_NICE (default 0) is the nodes'
# and this script's rabbitmqctl calls' niceness: CI gives them -5, so that a
# node boots in seconds on a machine that the other tests keep busy.
#
# What a fault round asks often (is a node up, which node leads a queue) goes
# through erl_call (Erlang's own, in erlang-base: a C program that calls a
# function on the node), not rabbitmqctl: each rabbitmqctl call boots an
# Erlang VM, about 1.5 s of CPU, and a round made a dozen of them; on a
# machine kept busy by the load of the fault tests one call took 30 s, and a
# round 80 to 120 s (0.1 to 0.3 s by erl_call).
set -euo pipefail

CLUSTER_DIR=${CLUSTER_DIR:-/tmp/rabbitmq-cluster}
CLUSTER_BASE_PORT=${CLUSTER_BASE_PORT:-5681}
RABBITMQ_BIN=${RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
NODES=3
CLUSTER_NICE=${CLUSTER_NICE:-0}
[[ $CLUSTER_NICE =~ ^-?[0-9]+$ ]] || { echo "cluster.sh: CLUSTER_NICE must be a number, got '$CLUSTER_NICE'" >&2; exit 2; }

die() { echo "cluster.sh: $*" >&2; exit 1; }
node() { echo "cluster$1@localhost"; }
port() { echo $((CLUSTER_BASE_PORT + $1 - 1)); }
url() { echo "amqp://guest:guest@127.0.0.1:$(port "$1")/"; }
ctl() { local n=$1; shift; nice -n "$CLUSTER_NICE" rabbitmqctl -q -n "$(node "$n")" "$@"; }
pidfile() { echo "$CLUSTER_DIR/node$1/pid"; }
# rpc N ARG…: erl_call on node N (ARG… as erl_call takes them), given 10 s.
# It reads the nodes' cookie from its HOME, as the nodes do: on the command
# line (-c) the cookie would show in ps to every user of the machine. -R: a
# name the node gives the call; without it every erl_call is c17@host, and
# two at once (node loss runs both modes side by side) refuse each other.
rpc() {
  local n=$1
  shift
  HOME=/var/lib/rabbitmq erl_call -R -n "$(node "$n")" -timeout 10 "$@"
}
# is_node PID N: PID is a VM of the rabbitmq user whose environment names
# node N (a pid file's pid may have been taken by another process since).
is_node() {
  [[ $1 =~ ^[0-9]+$ && $(stat -c %U "/proc/$1" 2>/dev/null) == rabbitmq ]] || return 1
  # The process may end meanwhile: quietly not the node.
  { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null | grep -qx "RABBITMQ_NODENAME=$(node "$2")"
}
# node_pid N prints the OS pid of node N's VM: the one in its pid file, else
# (a pid file not yet written, or lost) the rabbitmq user's VM whose
# environment names the node; fails if none runs.
node_pid() {
  local pid p
  pid=$(cat "$(pidfile "$1")" 2>/dev/null) || pid=""
  if is_node "$pid" "$1"; then
    echo "$pid"
    return
  fi
  for p in $(pgrep -u rabbitmq -x beam.smp); do
    if is_node "$p" "$1"; then
      echo "$p"
      return
    fi
  done
  return 1
}
# alive N: node N has booted (what rabbitmqctl await_startup waits for).
alive() { [[ $(rpc "$1" -a 'rabbit_boot_state get []' 2>/dev/null) == ready ]]; }
# await_ready N DIR: waits until node N has booted, at most 300 s; fails
# at once if its VM, once seen, is gone. This and not rabbitmqctl wait
# PIDFILE, which read the file as the node wrote it and failed the start
# ({garbage_in_pid_file, …}).
await_ready() {
  local n=$1 dir=$2 seen=0 deadline=$((SECONDS + 300))
  until alive "$n"; do
    if node_pid "$n" >/dev/null; then
      seen=1
    elif ((seen)); then
      die "node $n exited while it booted: see $dir/log"
    fi
    ((SECONDS < deadline)) || die "node $n did not boot within 300 s: see $dir/log"
    sleep 0.5
  done
}

check_n() {
  [[ "${1:-}" =~ ^[1-3]$ ]] || die "node number must be 1, 2 or 3, got '${1:-}'"
}

# start_node N starts node N unless it runs. One start of a node at a time
# (two calls, two tests): the second waits, then finds it booted. Without
# the lock both could launch a VM of the same name before either showed (a
# VM appears seconds after its launch). The lock is held only for the start:
# a VM launched meanwhile must not inherit it (nor any other node's), or the
# next start of that node would wait forever.
start_node() {
  local n=$1 lock rc=0
  if alive "$n"; then return; fi
  mkdir -p "$CLUSTER_DIR"
  exec {lock}>"$CLUSTER_DIR/node$n.start-lock"
  flock "$lock"
  start_locked "$n" || rc=$?
  exec {lock}>&-
  return "$rc"
}

start_locked() {
  local n=$1 dir="$CLUSTER_DIR/node$1" p
  p=$(port "$n")
  if alive "$n"; then return; fi
  if node_pid "$n" >/dev/null; then
    # Booting (a start before this one, cut short): a second VM of the same
    # name would fail, and take the first one's pid file with it.
    await_ready "$n" "$dir"
    return
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    die "port $p is taken by something else: set CLUSTER_BASE_PORT"
  fi
  mkdir -p "$dir/mnesia" "$dir/log"
  printf 'listeners.tcp.local = 127.0.0.1:%s\n' "$p" >"$dir/rabbitmq.conf"
  echo '[].' >"$dir/enabled_plugins"
  : >"$dir/rabbitmq-env.conf" # not the machine's: it names the default node
  chown -R rabbitmq:rabbitmq "$CLUSTER_DIR"
  rm -f "$(pidfile "$n")" # a killed node's: await_ready reads the new one
  nice -n "$CLUSTER_NICE" runuser -u rabbitmq -- env -i PATH="$PATH" HOME=/var/lib/rabbitmq \
    RABBITMQ_NODENAME="$(node "$n")" RABBITMQ_NODE_PORT="$p" RABBITMQ_DIST_PORT=$((p + 20000)) \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_MNESIA_BASE="$dir/mnesia" \
    RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$(pidfile "$n")" ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} +sbwt none +sbwtdcpu none +sbwtdio none" \
    "$RABBITMQ_BIN/rabbitmq-server" -detached {lock}>&- # the VM must not hold the lock
  await_ready "$n" "$dir"
}

joined() { ctl 1 cluster_status --formatter json 2>/dev/null | grep -q "\"$(node "$1")\""; }

up() {
  [ "$(id -u)" = 0 ] || die "run as root (the nodes run as the rabbitmq user)"
  for n in $(seq "$NODES"); do start_node "$n"; done
  for n in $(seq 2 "$NODES"); do
    if ! joined "$n"; then
      ctl "$n" stop_app
      ctl "$n" join_cluster "$(node 1)"
      ctl "$n" start_app
    fi
  done
  for n in $(seq "$NODES"); do await_ready "$n" "$CLUSTER_DIR/node$n"; done
  urls
}

urls() { for n in $(seq "$NODES"); do url "$n"; done; }

kill_node() {
  local pid
  pid=$(node_pid "$1") || die "node $1 runs no process: is the cluster up?"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  die "node $1 (pid $pid) did not die"
}

down() {
  for n in $(seq "$NODES"); do
    if alive "$n"; then ctl "$n" stop >/dev/null 2>&1 || true; fi
    local pid
    pid=$(node_pid "$n") || continue
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$CLUSTER_DIR"
}

# ctl_live runs rabbitmqctl on the first live node. A node that dies between
# the check and the call (another test's fault round) fails it with 69, the
# CLI's code for "unavailable" and also for a command's own generic error:
# the call goes on to the next live node only if its node is down now, and
# says so. Any other failure is the command's, with its message.
ctl_live() {
  local n rc
  ctl_err=$(mktemp) # not local: the trap runs when the script exits
  trap 'rm -f "$ctl_err"' EXIT
  for n in $(seq "$NODES"); do
    alive "$n" || continue
    rc=0
    ctl "$n" "$@" 2>"$ctl_err" || rc=$?
    if ((rc == 69)) && ! alive "$n"; then
      echo "cluster.sh: node $n went down during the call; trying the next live node" >&2
      continue
    fi
    cat "$ctl_err" >&2
    return "$rc"
  done
  die "no node is up"
}

# leader VHOST QUEUE prints the node (1-3) that leads quorum queue QUEUE of
# VHOST, as rabbitmqctl list_queues' leader column has it, asked of the
# first live node; 0 if no running node leads it (an election under way) or
# the queue does not exist. Any other answer (an error) fails.
leader() {
  local vhost=$1 queue=$2 n out
  [[ $vhost =~ ^[A-Za-z0-9_.:-]+$ && $queue =~ ^[A-Za-z0-9_.:-]+$ ]] ||
    die "leader: the vhost and the queue must be names of letters, digits and _.:- (got '$vhost' '$queue')"
  for n in $(seq "$NODES"); do
    alive "$n" || continue
    # rabbit_quorum_queue:info's leader, as list_queues prints it: '' while
    # the leader the queue's record names is not running (a node just
    # killed, an election under way).
    out=$(rpc "$n" -e <<<"case rabbit_amqqueue:lookup(rabbit_misc:r(<<\"$vhost\">>, queue, <<\"$queue\">>)) of
      {ok, Q} -> case rabbit_quorum_queue:info(Q, [leader]) of [{leader, L}] -> {leader, L}; I -> {unexpected, I} end;
      {error, not_found} -> not_found end.") || continue # it went down during the call: the next
    case $out in
      "{ok, {leader, cluster"[1-3]"@localhost}}") out=${out#*cluster}; echo "${out%%@*}" ;;
      "{ok, {leader, ''}}" | "{ok, not_found}") echo 0 ;;
      *) die "leader $vhost $queue: node $n answered $out" ;;
    esac
    return
  done
  die "no node is up"
}

status() {
  for n in $(seq "$NODES"); do
    if alive "$n"; then ctl "$n" cluster_status; return; fi
  done
  die "no node is up"
}

case "${1:-}" in
  up) up ;;
  urls) urls ;;
  status) status ;;
  kill) check_n "${2:-}"; kill_node "$2" ;;
  start) check_n "${2:-}"; start_node "$2" ;;
  leader) [[ $# -eq 3 ]] || die "usage: cluster.sh leader VHOST QUEUE"; leader "$2" "$3" ;;
  ctl) shift; ctl_live "$@" ;;
  down) down ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
