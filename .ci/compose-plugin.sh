# shellcheck shell=bash
# compose-plugin.sh, sourced by .ci/compose-check/run.sh and .ci/stack:
# install_compose_plugin builds Docker Compose ${compose_version} from its Go
# module (through the Go module proxy) into the user's CLI plugin directory,
# outside any clone, unless that version is there already. A cold build takes
# 2 to 3 minutes on 2 cores; later runs reuse the binary.

compose_version=v2.40.3
compose_plugin="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins/docker-compose"

# install_compose_plugin: `go install module@version` refuses Compose (its
# go.mod has exclude directives), so the module is built from a writable copy.
install_compose_plugin() {
  if [[ -x $compose_plugin ]] && [[ "$("$compose_plugin" version --short 2>/dev/null)" == "${compose_version#v}" ]]; then
    printf '== docker compose %s already installed at %s\n' "$compose_version" "$compose_plugin"
    return
  fi
  printf '== building docker compose %s from its Go module\n' "$compose_version"
  local src
  src="$(mktemp -d)"
  # Outside any module, so that nothing touches a go.mod or go.sum.
  (cd "$src" && GOFLAGS=-mod=mod go mod download "github.com/docker/compose/v2@${compose_version}")
  cp -R "$(go env GOMODCACHE)/github.com/docker/compose/v2@${compose_version}/." "$src/compose"
  chmod -R u+w "$src/compose"
  mkdir -p "$(dirname "$compose_plugin")"
  (cd "$src/compose" && CGO_ENABLED=0 go build -trimpath \
    -ldflags="-s -w -X github.com/docker/compose/v2/internal.Version=${compose_version}" \
    -o "$compose_plugin.tmp" ./cmd)
  mv "$compose_plugin.tmp" "$compose_plugin"
  rm -rf "$src"
}
