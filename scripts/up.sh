#!/usr/bin/env bash
# up.sh: the Compose stack in one command (make up), on any machine with a
# Docker engine: it says precisely what is missing, builds stand-in images
# when no registry answers, runs `docker compose up --build --wait`, waits
# for the demo load to drain, and prints one line about it:
#
#   demo run <id>: 200 orders in 258 messages (41 duplicates, 11 republishes, 6 poison) -> 200 payments (1 declined), 6 dead letters, 199 shipments: PASS
#
# It exits 0 on PASS, 1 on FAIL (the verify report follows the line) or when
# the stack does not come up, 2 when something is missing; every refusal ends
# with a line that says why. `make down` removes the stack, its volumes
# included.
#
# Settings (environment): COMPOSE_PROJECT_NAME and the *_HOST_PORT variables
# as docker compose reads them (also from .env); UP_WAIT_TIMEOUT (seconds up
# may wait for health, default 300); UP_DRAIN_TIMEOUT (seconds the demo load
# may take to drain, default 180).
set -euo pipefail
cd "$(dirname "$0")/.."

missing() {
  printf 'make up: %s\n' "$*" >&2
  exit 2
}
failed() {
  printf 'make up: %s\n' "$*" >&2
  exit 1
}

command -v docker >/dev/null ||
  missing "no docker command: install Docker Engine 20.10 or later (Debian: apt-get install docker.io)"
timeout 20 docker info >/dev/null 2>&1 ||
  missing "the Docker engine does not answer (docker info): start it (systemctl start docker; in a container, dockerd &), or run as a user who may use it"
docker compose version >/dev/null 2>&1 ||
  missing "the Compose v2 plugin is missing (docker compose version): install docker-compose-plugin, or build it from the Go module proxy with: bash .ci/compose-check/run.sh --build-plugin"
# The file's depends_on entries with "required: false" (the profile cluster's
# nodes) need Compose 2.20 or later; an older one refuses the file. A plugin
# built from source may say "dev" instead of a number: that cannot be checked,
# and is most likely recent, so it goes on with a warning.
compose_said=$(docker compose version 2>/dev/null | head -n1) || true
compose_version=$(grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' <<<"$compose_said" | head -n1) || true
if [[ -z $compose_version ]]; then
  if [[ -n $compose_said ]]; then
    printf 'make up: warning: Compose says its version is "%s", which cannot be checked against the 2.20 this file needs: going on\n' "$compose_said" >&2
  else
    printf 'make up: warning: Compose says no version (docker compose version), so the 2.20 this file needs cannot be checked: going on\n' >&2
  fi
else
  IFS=. read -r compose_major compose_minor _ <<<"$compose_version"
  ((compose_major > 2 || (compose_major == 2 && compose_minor >= 20))) ||
    missing "Compose $compose_version is too old: this file needs 2.20 or later (depends_on ... required: false); install a newer docker-compose-plugin, or build v2.40.3 with: bash .ci/compose-check/run.sh --build-plugin"
fi

# Every image the Dockerfile builds FROM and the stack runs: present (left
# alone), pulled, or built as a stand-in where no registry answers (root and
# mmdebstrap needed then; the script says so).
bash .ci/stack-images/build.sh ||
  missing "the images could not be pulled or built (.ci/stack-images/build.sh above says why)"

echo "make up: docker compose up --build --wait"
docker compose up --build --wait --wait-timeout "${UP_WAIT_TIMEOUT:-300}" ||
  failed "docker compose up --build --wait failed (its output above says why; docker compose ps and docker compose logs SERVICE show more)"

demo=$(docker compose logs --no-log-prefix order-publisher 2>/dev/null) ||
  failed "the stack is up, but docker compose logs order-publisher fails: the demo load's run cannot be read"
# sent LABEL: a number of the publisher's summary ("orders", "  duplicates (same id)").
sent() { awk -v k="$1:" 'index($0, k) == 1 { v = substr($0, length(k) + 1); sub(/^ +/, "", v); sub(/ .*/, "", v); n = v } END { print n + 0 }' <<<"$demo"; }
run_id=$(awk -F': *' '/^run id:/ { id = $2 } END { print id }' <<<"$demo")
orders=$(sent orders)
if [[ -z $run_id ]]; then
  echo "make up: the stack is up; the demo load was published on an earlier up (down -v resets it), so there is no run to summarise"
  exit 0
fi

# The demo load drains within seconds; verify until it passes, or report the
# last verdict when it does not in time.
deadline=$((SECONDS + ${UP_DRAIN_TIMEOUT:-180}))
while :; do
  rc=0
  report=$(docker compose run --rm --no-deps -T inboxctl verify --run-id "$run_id" --orders "$orders" 2>&1) || rc=$?
  if ((rc == 0)) || ((SECONDS >= deadline)); then break; fi
  sleep 3
done
value() { awk -v k="$1" '{ sub(/^ +/, "") } index($0, k) == 1 && substr($0, length(k) + 1) ~ /^ +[0-9]+$/ { v = $NF } END { print v + 0 }' <<<"$report"; }
verdict=FAIL
((rc == 0)) && verdict=PASS
# The publisher's figures say what was sent, verify's what became of it (a
# fresh volume has no other run: its dead letters are this run's).
printf 'demo run %s: %d orders in %d messages (%d duplicates, %d republishes, %d poison) -> %d payments (%d declined), %d dead letters, %d shipments: %s\n' \
  "$run_id" "$orders" "$(sent 'messages published')" "$(sent '  duplicates (same id)')" "$(sent '  republishes (new id)')" \
  "$(sent '  poison')" "$(value payments)" "$(value declined)" "$(value dead-lettered)" "$(value shipments)" "$verdict"
if [[ $verdict == FAIL ]]; then
  echo "$report"
  exit 1
fi
