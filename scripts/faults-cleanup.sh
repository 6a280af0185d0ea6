#!/usr/bin/env bash
# faults-cleanup.sh: removes what fault runs left behind on the local broker and
# PostgreSQL: the vhosts and databases <prefix>_faults<pid>_… (the prefix is
# TEST_NAME_PREFIX, t unless set) of a local-mode run (its Go test) killed
# before its cleanup ran, and those of earlier versions of the
# kit (inbox-faults-<scenario>-<timestamp>-<pid>, faults_<timestamp>_<pid>_…).
# Resources of a run whose script is still alive (its pid, in the name) are
# left alone. Run directories under ${TMPDIR:-/tmp}/inbox-faults are kept
# (delete them by hand).
set -euo pipefail

export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
read -r -a rabbitmqctl <<<"${RABBITMQCTL:-rabbitmqctl}"
prefix=${TEST_NAME_PREFIX:-t}
[[ $prefix =~ ^[a-z][a-z0-9]{0,11}$ ]] ||
  { echo "faults-cleanup.sh: TEST_NAME_PREFIX='$prefix': want a lowercase letter, then up to 11 lowercase letters and digits" >&2; exit 2; }

# alive PID: a process with that pid still runs (then its run is not leftover).
alive() { kill -0 "$1" 2>/dev/null; }

removed=0
while read -r vhost; do
  [[ $vhost =~ ^${prefix}_faults([0-9]+)_ || $vhost =~ ^inbox-faults-.+-[0-9]{14}-([0-9]+)$ ]] || continue
  alive "${BASH_REMATCH[1]}" && continue
  timeout 60 "${rabbitmqctl[@]}" -q delete_vhost "$vhost" >/dev/null
  echo "deleted vhost $vhost"
  removed=$((removed + 1))
done < <(timeout 60 "${rabbitmqctl[@]}" -q list_vhosts name --no-table-headers)

while read -r db; do
  [[ $db =~ ^${prefix}_faults([0-9]+)_ || $db =~ ^faults_[0-9]{14}_([0-9]+)_[a-z]+$ ]] || continue
  alive "${BASH_REMATCH[1]}" && continue
  timeout 60 dropdb --if-exists --force "$db"
  echo "dropped database $db"
  removed=$((removed + 1))
done < <(timeout 30 psql -d postgres -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'faults\_%' OR datname LIKE '${prefix}\_faults%'")

echo "$removed leftovers removed"
