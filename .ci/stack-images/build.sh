#!/usr/bin/env bash
# .ci/stack-images/build.sh: makes sure the local Docker engine has every image
# the Dockerfile builds FROM and docker-compose.yml runs. A missing image is
# pulled; when the pull fails (no registry reachable: an air-gapped machine,
# or this project's CI), a stand-in is built and tagged with the exact name the
# files use, from a Debian bookworm base made here (mmdebstrap, docker import):
#
#   golang:<v>                                 Debian + the host's Go <v> (or <v> from the module proxy) + the host's CA bundle
#   gcr.io/distroless/static-debian12:nonroot  passwd/group with nonroot (65532), CA certificates, time zones, /tmp
#   postgres:<v>                               Debian's PostgreSQL 15, with the official entrypoint's contract
#   rabbitmq:<v>-management                    Debian's RabbitMQ 3.10, management and prometheus plugins
#   prom/prometheus:<v>                        Debian's Prometheus, with wget
#   otel/opentelemetry-collector-contrib:<v>   the collector of release <v>, built here from the Go module proxy (otel-collector/);
#                                              the profile tracing's only: with --profile tracing (or COMPOSE_PROFILES=tracing)
#
# The stand-ins are not the pinned versions: they run the same contract (the
# variables, paths and commands the stack uses) on Debian's packages. An image
# that is already there, real or stand-in, is never touched; remove a stand-in
# with `docker rmi NAME` to build it again.
#
#   .ci/stack-images/build.sh [--no-pull] [--profile NAME]...
#
# The images are those of the services `docker compose up` starts, plus those
# of the profiles named (--profile, as docker compose takes it, '*' for every
# one; or COMPOSE_PROFILES, which docker compose reads itself): the
# collector's stand-in, the longest to build (2 to 3 minutes on 2 cores),
# is built only for the profile tracing.
#
# Settings (environment): DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR (plain HTTP;
# default: the host's apt sources, else deb.debian.org), STANDIN_PULL_TIMEOUT
# (seconds a pull may take, default 120). Needs a running engine, docker
# compose, and for the base mmdebstrap (run as root).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
base_image=inbox-template/standin-base:bookworm
pull=true

log() { printf '== %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

profiles=()
while (($#)); do
  case $1 in
    --no-pull) pull=false; shift ;;
    --profile)
      [[ $# -ge 2 && -n $2 ]] || { echo "usage: $0 [--no-pull] [--profile NAME]..." >&2; exit 2; }
      profiles+=(--profile "$2")
      shift 2
      ;;
    *) echo "usage: $0 [--no-pull] [--profile NAME]..." >&2; exit 2 ;;
  esac
done

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# dockerfile_bases prints the images the Dockerfile starts FROM, with the
# defaults of the ARGs declared before the first FROM substituted.
dockerfile_bases() {
  awk '
    /^[[:space:]]*#/ { next }
    toupper($1) == "ARG" && !seen_from {
      for (i = 2; i <= NF; i++) if (split($i, kv, "=") == 2) arg[kv[1]] = kv[2]
    }
    toupper($1) == "FROM" {
      seen_from = 1
      img = ""
      for (i = 2; i <= NF; i++) if ($i !~ /^--/) { img = $i; break }
      for (k in arg) { gsub("\\$\\{" k "\\}", arg[k], img); gsub("\\$" k, arg[k], img) }
      for (i = 2; i <= NF; i++) if (toupper($i) == "AS") stage[$(i + 1)] = 1
      if (!(img in stage) && img != "scratch") print img
    }
  ' "$root/Dockerfile" | sort -u
}

# compose_images prints the images of the Compose services that do not build
# their own: the default ones and those of the profiles asked for.
compose_images() {
  docker compose --project-directory "$root" -f "$root/docker-compose.yml" ${profiles[@]+"${profiles[@]}"} config |
    awk '
      function flush() { if (img != "" && !build) print img; img = ""; build = 0 }
      /^services:/ { in_services = 1; next }
      in_services && /^[^ ]/ { flush(); in_services = 0 }
      in_services && /^  [^ ]/ { flush() }
      in_services && /^    build:/ { build = 1 }
      in_services && /^    image:/ { img = $2 }
      END { flush() }
    ' | sort -u
}

# standin_dir IMAGE prints the directory (here) of the stand-in for IMAGE.
standin_dir() {
  case $1 in
    golang:*) echo golang ;;
    gcr.io/distroless/static-debian12:nonroot) echo distroless-static ;;
    postgres:*) echo postgres ;;
    rabbitmq:*-management) echo rabbitmq ;;
    prom/prometheus:*) echo prometheus ;;
    otel/opentelemetry-collector-contrib:*) echo otel-collector ;;
    *) return 1 ;;
  esac
}

# apt_uri SUFFIX prints the host's first plain-HTTP apt source ending in
# SUFFIX (/debian or /debian-security).
apt_uri() {
  local files=() f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  grep -hoE 'http://[^[:space:]]+' "${files[@]}" 2>/dev/null | sed 's:/*$::' | grep -m1 -E "$1\$" || true
}

build_base() {
  have_image "$base_image" && return
  command -v mmdebstrap >/dev/null || die "mmdebstrap is needed to make the Debian base (apt-get install mmdebstrap)"
  local mirror security dir
  mirror=${DEBIAN_MIRROR:-$(apt_uri /debian)}
  mirror=${mirror:-http://deb.debian.org/debian}
  security=${DEBIAN_SECURITY_MIRROR:-$(apt_uri /debian-security)}
  security=${security:-http://deb.debian.org/debian-security}
  log "Debian bookworm base from $mirror (mmdebstrap --variant=minbase), imported as $base_image"
  dir=$(mktemp -d)
  mmdebstrap --quiet --variant=minbase bookworm "$dir/rootfs.tar" \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main"
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    "$dir/rootfs.tar" "$base_image" >/dev/null
  rm -rf "$dir"
}

# The stand-ins are plain Dockerfiles: the classic builder of any engine
# builds them, with no BuildKit frontend to pull. Its output is shown only
# when the build fails.
docker_build() {
  local out
  out=$(mktemp)
  if ! DOCKER_BUILDKIT=0 docker build "$@" >"$out" 2>&1; then
    tail -n 40 "$out" >&2
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
}

# build_collector IMAGE: the collector's binary is built on the host (its
# module pins the release of the image's tag), then copied onto the base.
build_collector() {
  local image=$1 version ctx
  version=${image##*:}
  grep -q "go.opentelemetry.io/collector/otelcol v$version\b" "$here/otel-collector/go.mod" ||
    die "$image: otel-collector/go.mod pins another collector release than $version"
  ctx=$(mktemp -d)
  cp "$here/otel-collector/Dockerfile" "$ctx/"
  (cd "$here/otel-collector" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$ctx/otelcol-contrib" .)
  docker_build -t "$image" "$ctx"
  rm -rf "$ctx"
}

# build_golang IMAGE: Go is the host's toolchain when it is that version, else
# that version's toolchain module from the Go module proxy.
build_golang() {
  local image=$1 version goroot ctx args=() v
  version=${image#golang:}
  version=${version%%-*}
  if [[ $(go env GOVERSION) == "go$version" ]]; then
    goroot=$(go env GOROOT)
  else
    log "fetching Go $version from the module proxy (golang.org/toolchain)"
    goroot=$(cd / && GOTOOLCHAIN="go$version" go env GOROOT)
  fi
  [[ -x $goroot/bin/go ]] || die "no Go $version toolchain at $goroot"
  ctx=$(mktemp -d)
  cp "$here/golang/Dockerfile" "$ctx/"
  cp -R "$goroot" "$ctx/go"
  chmod -R u+w "$ctx/go"
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca-certificates.crt"
  args+=(--build-arg "GO_VERSION=$version")
  for v in GOPROXY GOSUMDB GONOSUMDB GOPRIVATE GONOPROXY GOINSECURE; do
    args+=(--build-arg "$v=$(go env "$v")")
  done
  docker_build "${args[@]}" -t "$image" "$ctx"
  rm -rf "$ctx"
}

images=$( (dockerfile_bases; compose_images) | sort -u)
[[ -n $images ]] || die "found no image names in the Dockerfile and docker-compose.yml"
for image in $images; do
  if have_image "$image"; then
    log "$image: present"
    continue
  fi
  if $pull && timeout "${STANDIN_PULL_TIMEOUT:-120}" docker pull -q "$image" >/dev/null 2>&1; then
    log "$image: pulled"
    continue
  fi
  dir=$(standin_dir "$image") || die "$image cannot be pulled and has no stand-in in $here"
  start=$SECONDS
  build_base
  if [[ $dir == golang ]]; then
    build_golang "$image"
  elif [[ $dir == otel-collector ]]; then
    build_collector "$image"
  else
    docker_build -t "$image" "$here/$dir"
  fi
  stages=$(docker images -q --filter dangling=true --filter label=inbox-template.standin-stage)
  # shellcheck disable=SC2086 # one id a word
  [[ -z $stages ]] || docker rmi $stages >/dev/null 2>&1 || true
  log "$image: stand-in built from $dir/ in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
done
