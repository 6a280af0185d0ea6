#!/usr/bin/env bash
# Validates the container stack without a Docker engine:
#   1. internal/demo/config's .env.example test (every variable the programs read,
#      with its default, and nothing else);
#   2. this module's tests: docker-compose.yml loaded by compose-go, the loader
#      Docker Compose uses, with and without .env.example, plus the stack's
#      promises (health checks, replicas, start order, volumes, images), and
#      the Dockerfile's targets (distroless static, nonroot, binaries only)
#      and its `go build` run here, with each image's size checked, and
#      scripts/up.sh's refusals against a stub docker;
#   3. `docker compose config -q` with the real Compose CLI, when one is
#      installed, or built from its Go module with --build-plugin (a cold build
#      takes 2 to 3 minutes on 2 cores; later runs reuse the installed binary).
# Exits non-zero on the first failure.
#
#   .ci/compose-check/run.sh [--build-plugin]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=../compose-plugin.sh
source "$here/../compose-plugin.sh"

log() { printf '== %s\n' "$*"; }

usage() {
  echo "usage: $0 [--build-plugin]" >&2
  exit 2
}

build_plugin=false
case "${1:-}" in
  "") ;;
  --build-plugin) build_plugin=true ;;
  *) usage ;;
esac

# compose runs the Compose CLI: through docker when it is there, else the
# plugin binary alone (it also works as a standalone docker-compose).
compose() {
  if command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
    docker compose "$@"
  elif [[ -x $compose_plugin ]]; then
    "$compose_plugin" "$@"
  else
    return 127
  fi
}

log ".env.example against the programs' configuration"
(cd "$root" && go test -count=1 -run 'TestEnvExampleMatchesPrograms|TestEveryProgramConfigIsListed' ./internal/demo/config)

log "docker-compose.yml and Dockerfile (compose-go)"
(cd "$here" && go test -count=1 ./...)

if $build_plugin; then
  install_compose_plugin
fi
if compose version >/dev/null 2>&1; then
  log "docker compose config ($(compose version --short))"
  compose --project-directory "$root" -f "$root/docker-compose.yml" \
    --env-file "$root/.env.example" --profile '*' config -q
  compose --project-directory "$root" -f "$root/docker-compose.yml" \
    --env-file /dev/null --profile '*' config -q
else
  log "no Compose CLI here: skipped docker compose config (run with --build-plugin to build it)"
fi
log "compose check passed"
