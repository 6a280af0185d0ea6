#!/usr/bin/env bash
# Validates the container stack without a Docker engine:
#   1. internal/config's .env.example test (every variable the programs read,
#      with its default, and nothing else);
#   2. this module's tests: docker-compose.yml loaded by compose-go, the loader
#      Docker Compose uses, with and without .env.example, plus the stack's
#      promises (health checks, replicas, start order, volumes, images), and
#      the Dockerfile's targets (distroless static, nonroot, binaries only)
#      and its `go build` run here, with each image's size checked;
#   3. `docker compose config -q` with the real Compose CLI, when one is
#      installed, or built from its Go module with --build-plugin (a cold build
#      takes 6-8 minutes on 2 cores; later runs reuse the installed binary).
# Exits non-zero on the first failure.
#
#   .ci/compose-check/run.sh [--build-plugin]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
compose_version=v2.40.3
plugin="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins/docker-compose"

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

# build_compose_plugin builds Docker Compose from its module in the Go module
# cache. `go install module@version` refuses it (its go.mod has exclude
# directives), so the module is built from a writable copy.
build_compose_plugin() {
  if [[ -x $plugin ]] && [[ "$("$plugin" version --short 2>/dev/null)" == "${compose_version#v}" ]]; then
    log "docker compose ${compose_version} already installed at $plugin"
    return
  fi
  log "building docker compose ${compose_version} from its Go module"
  local src
  src="$(mktemp -d)"
  # Outside any module, so that nothing touches a go.mod or go.sum.
  (cd "$src" && GOFLAGS=-mod=mod go mod download "github.com/docker/compose/v2@${compose_version}")
  cp -R "$(go env GOMODCACHE)/github.com/docker/compose/v2@${compose_version}/." "$src/compose"
  chmod -R u+w "$src/compose"
  mkdir -p "$(dirname "$plugin")"
  (cd "$src/compose" && CGO_ENABLED=0 go build -trimpath \
    -ldflags="-s -w -X github.com/docker/compose/v2/internal.Version=${compose_version}" \
    -o "$plugin" ./cmd)
  rm -rf "$src"
}

# compose runs the Compose CLI: through docker when it is there, else the
# plugin binary alone (it also works as a standalone docker-compose).
compose() {
  if command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
    docker compose "$@"
  elif [[ -x $plugin ]]; then
    "$plugin" "$@"
  else
    return 127
  fi
}

log ".env.example against the programs' configuration"
(cd "$root" && go test -count=1 -run 'TestEnvExampleMatchesPrograms|TestEveryProgramConfigIsListed' ./internal/config)

log "docker-compose.yml and Dockerfile (compose-go)"
(cd "$here" && go test -count=1 ./...)

if $build_plugin; then
  build_compose_plugin
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
