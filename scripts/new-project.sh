#!/usr/bin/env bash
# new-project.sh: your own copy of this template, under your module path, and
# optionally a new service in it.
#
#   scripts/new-project.sh MODULE_PATH DIR
#   scripts/new-project.sh MODULE_PATH DIR --service NAME --event EVENT --exchange X --routing-key K [--no-outside-calls] [--ordered] [--publishes X2] [--bare [--kit-version V] [--kit-proxy DIR2]]
#   scripts/new-project.sh example.com/acme/refunds ../refunds \
#     --service refund-service --event refund-requested --exchange payments --routing-key refund.requested
#
# Copies the repository's files (those git tracks, or the whole tree of a copy
# that is not a git checkout, without bin/) into DIR, keeping their modes (the
# scripts stay executable), and renames what names this copy:
#   - the Go module path, in every go.mod, Go file and document;
#   - the images (inbox-template/<image>:<tag> becomes <name>/<image>:<tag>)
#     and the Compose project (name: <name>), where <name> is the last element
#     of MODULE_PATH; a copy of a copy renames its own names the same way;
# then checks that nothing names the old module path any more. DIR must not
# exist or be empty. It changes nothing here. Next steps are printed at the end.
#
# With --service, it also writes a new service in the copy, consuming EVENT
# from the topic exchange X with the binding key K, rendered from
# scripts/template (a service of this repository, compiled and tested with
# it; its README tells how the options select its lines): internal/<pkg>/ (the
# handler with its contract spelled out and a TODO where the business logic
# goes, the event and its decoder, Service(), a migration) and cmd/NAME/main.go,
# where <pkg> is NAME without its -service suffix, and an end-to-end test
# (internal/<pkg>/<pkg>_test.go) that runs the service as a process against
# the real RabbitMQ and PostgreSQL, as generated: each record once,
# duplicates suppressed, poison dead-lettered (--ordered: parked) with its
# reason.
#
# The service is generated for a handler that calls out (a payment gateway, a
# carrier): the kit keeps its retries, and dlq replay, within
# IDEMPOTENCY_KEY_TTL, how long the services it calls remember an idempotency
# key (the key-expiry guard). --no-outside-calls declares instead that the
# handler only writes its own database (Options.NoOutsideCalls: no guard, no
# replay age limit, IDEMPOTENCY_KEY_TTL refused): say so only when it is true,
# since a call added later under that declaration goes unguarded.
#
# With --ordered (and --service), one key's events are processed in the
# order they were published: the service requires the buffered inbox
# (INBOX_MODE=buffered: each message stored and acked at once, then processed
# from the table a key at a time) and a single active consumer (one replica
# consumes the queue at a time, so replicas store one key's messages in the
# broker's order). A message that fails for good is parked there, blocking
# its key until an operator acts (inbox retry, skip, export); a poison body
# is parked as a key of its own, blocking nothing; the generated test checks
# that.
#
# With --publishes X2 (and --service), the service emits an event for each
# record it makes, through the outbox: <pkg>.recorded on the topic exchange
# X2, with the record's key as its ordering key, enqueued in the inbox
# transaction and published by the outbox relay once the broker confirms it;
# the generated test binds a queue to it and counts one event per record.
#
# With --bare (and --service), the project is that one service on the kit as
# a library: no copy of the kit, the payment service, the demo, the examples,
# the bench or the fault scripts. Its go.mod requires the kit's module (under
# its own path, not renamed) at a version: --kit-version V, by default the
# Version this checkout's kit declares (kit.Version); a kit upgrade is then
# `go get <kit module>@V2` (docs/upgrading.md). The go command must find the
# kit at that version: published, or served from a module proxy of your own.
# --kit-proxy DIR serves this checkout's kit into DIR (a file-based module
# proxy, written by scripts/kitproxy) and resolves it from there. The project
# gets its own README, Makefile, .ci/run, Dockerfile, docker-compose.yml
# (RabbitMQ, PostgreSQL, the service) and .env.example (the service's `env`
# command), and go mod tidy keeps only what it uses.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
old_module=$(awk '$1 == "module" { print $2; exit }' "$here/go.mod")
# The names of this copy as they are now: a copy of a copy renames its own.
old_project=$(awk '$1 == "name:" { print $2; exit }' "$here/docker-compose.yml")
old_prefix=$(grep -m1 -oE '^ +image: [a-z0-9._-]+/[a-z0-9._-]+:dev$' "$here/docker-compose.yml" | sed -E 's#^ +image: ([^/]+)/.*#\1#')
# The kit: its module path and the release this checkout holds.
kit_module=$(awk '$1 == "module" { print $2; exit }' "$here/kit/go.mod")
kit_release=$(sed -nE 's/^const Version = "([^"]+)"$/\1/p' "$here/kit/internal/release/release.go")
[[ -n $old_module && -n $old_project && -n $old_prefix && -n $kit_module && -n $kit_release ]] ||
  { echo "$0: cannot read the module path, the Compose project, the image prefix or the kit's module and Version of $here" >&2; exit 1; }

usage() {
  echo "usage: $0 MODULE_PATH DIR [--service NAME --event EVENT --exchange X --routing-key K [--no-outside-calls] [--ordered] [--publishes X2] [--bare [--kit-version V] [--kit-proxy DIR2]]]" >&2
  echo "  e.g. $0 example.com/acme/refunds ../refunds --service refund-service --event refund-requested --exchange payments --routing-key refund.requested" >&2
  exit 2
}
# camel refund-requested prints RefundRequested.
camel() {
  local out="" w
  IFS=- read -r -a words <<<"$1"
  for w in "${words[@]}"; do out+="${w^}"; done
  echo "$out"
}

args=()
svc="" event="" exchange="" routing_key="" bare=0 no_outside_calls=0 ordered=0 publishes="" kit_version="" kit_proxy=""
while (($#)); do
  case $1 in
    --bare) bare=1; shift ;;
    --no-outside-calls) no_outside_calls=1; shift ;;
    --ordered) ordered=1; shift ;;
    --service | --event | --exchange | --routing-key | --publishes | --kit-version | --kit-proxy)
      [[ $# -ge 2 && -n $2 && $2 != -* ]] || { echo "$0: $1 needs a value" >&2; usage; }
      case $1 in
        --kit-version) kit_version=$2 ;;
        --kit-proxy) kit_proxy=$2 ;;
        --service) svc=$2 ;;
        --event) event=$2 ;;
        --exchange) exchange=$2 ;;
        --routing-key) routing_key=$2 ;;
        --publishes) publishes=$2 ;;
      esac
      shift 2
      ;;
    -h | --help) usage ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ ${#args[@]} -eq 2 ]] || usage
module=${args[0]}
dir=${args[1]}
if ((bare)) && [[ -z $svc ]]; then
  echo "$0: --bare needs --service: the copy keeps the kit and one service of yours" >&2
  exit 2
fi
if [[ -n $kit_version$kit_proxy ]] && ((!bare)); then
  echo "$0: --kit-version and --kit-proxy need --bare: a full copy holds the kit's source" >&2
  exit 2
fi
if [[ -n $kit_version && ! $kit_version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "$0: --kit-version $kit_version: want a version like v0.1.0" >&2
  exit 2
fi
if [[ -n $kit_proxy && -n $kit_version && $kit_version != "$kit_release" ]]; then
  echo "$0: --kit-proxy serves this checkout's kit, which is $kit_release (kit/internal/release/release.go), not --kit-version $kit_version" >&2
  exit 2
fi
kit_version=${kit_version:-$kit_release}
if ((no_outside_calls)) && [[ -z $svc ]]; then
  echo "$0: --no-outside-calls needs --service: it describes the handler of the service it writes" >&2
  exit 2
fi
if [[ -n $publishes && -z $svc ]]; then
  echo "$0: --publishes needs --service: it describes the service it writes" >&2
  exit 2
fi
if [[ -n $publishes && ! $publishes =~ ^[A-Za-z0-9._-]+$ ]]; then
  echo "$0: --publishes $publishes: letters, digits, . _ - only" >&2
  exit 2
fi
if ((ordered)) && [[ -z $svc ]]; then
  echo "$0: --ordered needs --service: it describes the service it writes" >&2
  exit 2
fi
if [[ -n $svc$event$exchange$routing_key ]]; then
  [[ -n $svc && -n $event && -n $exchange && -n $routing_key ]] ||
    { echo "$0: --service, --event, --exchange and --routing-key go together" >&2; exit 2; }
  [[ $svc =~ ^[a-z][a-z0-9]*(-[a-z0-9]+)*$ ]] ||
    { echo "$0: --service $svc: want lowercase words joined by -, e.g. refund-service" >&2; exit 2; }
  [[ $event =~ ^[a-z][a-z0-9]*(-[a-z0-9]+)*$ ]] ||
    { echo "$0: --event $event: want lowercase words joined by -, e.g. refund-requested" >&2; exit 2; }
  [[ $exchange =~ ^[A-Za-z0-9._-]+$ ]] || { echo "$0: --exchange $exchange: letters, digits, . _ - only" >&2; exit 2; }
  [[ $routing_key =~ ^[A-Za-z0-9._-]+$ ]] || { echo "$0: --routing-key $routing_key: letters, digits, . _ - only (no wildcards)" >&2; exit 2; }
  # The service's package: its name without -service, e.g. internal/refund.
  pkg=${svc%-service}
  pkg=${pkg//-/}
  [[ -n $pkg ]] || { echo "$0: --service $svc leaves no package name" >&2; exit 2; }
  case $pkg in
    break | case | chan | const | continue | default | defer | else | fallthrough | for | func | go | goto | if | \
      import | interface | map | package | range | return | select | struct | switch | type | var | main)
      echo "$0: --service $svc: its package would be $pkg, which Go does not allow; choose another name" >&2
      exit 2
      ;;
    inbox | outbox | buffered)
      echo "$0: --service $svc: $pkg names one of the kit's schemas; choose another name" >&2
      exit 2
      ;;
  esac
  # The names the service's package declares beside the event's type and
  # its decoder.
  case $(camel "$event") in
    Record | Handler | Service | ReasonMissingField)
      echo "$0: --event $event: its type would collide with a name the generated package declares ($(camel "$event")); choose another name" >&2
      exit 2
      ;;
  esac
  # A full copy holds the template's services; a bare project none.
  if ((!bare)); then
    for taken in "internal/$pkg" "cmd/$svc"; do
      [[ ! -e $here/$taken ]] || { echo "$0: --service $svc would write $taken, which the template has" >&2; exit 2; }
    done
  fi
fi
[[ $module =~ ^[a-z0-9][a-z0-9.-]*(/[A-Za-z0-9._~-]+)+$ ]] ||
  { echo "$0: $module is not a module path like example.com/acme/shipping-service" >&2; exit 2; }
name=${module##*/}
name=$(tr '[:upper:]' '[:lower:]' <<<"$name")
[[ $name =~ ^[a-z0-9][a-z0-9_-]*$ ]] || { echo "$0: $name cannot name images and a Compose project" >&2; exit 2; }
if [[ -e $dir ]] && [[ -n $(ls -A "$dir") ]]; then
  echo "$0: $dir exists and is not empty" >&2
  exit 2
fi

src=$here
[[ ! -e $dir || -d $dir ]] || { echo "$0: $dir exists and is not a directory" >&2; exit 2; }
dst=$(realpath -m -- "$dir")
[[ $dst != "$src" && $dst != "$src"/* ]] || { echo "$0: $dir is inside the template" >&2; exit 2; }
mkdir -p "$dst"
# A run that fails, or is interrupted, leaves DIR empty, as it was (a second
# run would refuse a DIR that is not empty). DIR held nothing before: this
# deletes only what the run wrote.
trap 'status=$?; if ((status != 0)); then find "$dst" -mindepth 1 -delete 2>/dev/null || true; fi' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The kit's import path in the service's code: the copy's own kit/, renamed
# with the module, or (--bare) the kit's module at a version.
kit=$module/kit
# tar keeps the modes: the scripts stay executable. --bare takes only what
# its files do not write: the broker's setting of the Compose stack.
if ((bare)); then
  kit=$kit_module
  mkdir -p "$dst/deploy/rabbitmq" "$dst/deploy/postgres" "$dst/.ci"
  cp "$src/deploy/rabbitmq/20-max-message-size.conf" "$dst/deploy/rabbitmq/"
elif git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    tar -C "$src" --null -T - -cf - | tar -C "$dst" -xf -
else
  tar -C "$src" --exclude=./bin --exclude=./.git --exclude=./.test-report -cf - . | tar -C "$dst" -xf -
fi

# Rename in every text file; binary files are left alone. An image name is the
# prefix before /<image>:<tag> (never a module path, which has no tag), after a
# space, a quote, = or : (a YAML key), as in `image: inbox-template/x:dev`.
# One grep lists the files that name either, and sed takes them in a few
# runs: two commands a file (some 450 files) were most of a copy's time,
# 1.7 s of 2 on 2 cores. grep finding none (a --bare project's few files) is
# no error; a file it could not read keeps the module path, which the check
# below finds.
image_re="(^|[[:space:]\"'=:])$old_prefix/([a-z0-9._-]+):"
{ grep -rlIZE --exclude-dir=.git -e "$old_module" -e "$image_re" "$dst" || true; } |
  xargs -0r sed -i -E -e "s#$old_module#$module#g" -e "s#$image_re#\1$name/\2:#g"
((bare)) || sed -i -e "s#^name: $old_project\$#name: $name#" "$dst/docker-compose.yml"

left=$(grep -rIl --exclude-dir=.git -e "$old_module" "$dst" || true)
if [[ -n $left ]]; then
  printf '%s: these files still name %s:\n%s\n' "$0" "$old_module" "$left" >&2
  exit 1
fi

# ---------------------------------------------------------------- a new service

if [[ -n $svc ]]; then
  Event=$(camel "$event")
  table="${pkg}_records"
  # The service is scripts/template's, a real service in this repository
  # (compiled, vetted and tested with it: widget-service, its package
  # widget, its event widget-ordered), rendered for this one: each option's
  # blocks kept or dropped, then every name of the template's replaced by
  # the new service's.
  #   // gen:if OPTION, // gen:if !OPTION, // gen:else, // gen:end
  #       bracket the lines of one choice (OPTION: ordered, publishes,
  #       outside-calls); not nested;
  #   // gen> LINE
  #       a line of the choice the template itself does not make, kept as a
  #       comment there: the generator takes it out of the comment.
  # The replacements are made in one pass, so a name given here that holds
  # one of the template's (an event named widget-x) is not replaced again.
  # rename: stdin with every name of the template's replaced, in one pass.
  rename() {
    GEN_FROM="$old_module/scripts/template/internal/widget
$old_module/kit
widget-service
widget-ordered
WidgetOrdered
widget_records
widget.ordered
widget-events
widgets
widget" GEN_TO="$module/internal/$pkg
$kit
$svc
$event
$Event
$table
$routing_key
$publishes
$exchange
$pkg" perl -pe '
      BEGIN { my @from = split /\n/, $ENV{GEN_FROM}; my @to = split /\n/, $ENV{GEN_TO}, -1;
        @map{@from} = @to; $re = join "|", map { quotemeta } @from }
      s/($re)/$map{$1}/g'
  }
  render() { # render FILE: the rendered FILE on stdout
    awk -v ordered="$ordered" -v publishes="$([[ -n $publishes ]] && echo 1 || echo 0)" \
      -v outside="$((!no_outside_calls))" -v file="$1" '
      function fail(msg) { printf "%s:%d: %s\n", file, FNR, msg > "/dev/stderr"; failed = 1; exit 1 }
      function chosen(name, neg) {
        neg = sub(/^!/, "", name)
        if (name == "ordered") v = ordered
        else if (name == "publishes") v = publishes
        else if (name == "outside-calls") v = outside
        else fail("unknown option " name)
        return neg ? !v : v
      }
      BEGIN { keep = 1 }
      /^[ \t]*\/\/[ \t]*gen:if [!a-z-]+$/ { if (open) fail("gen:if inside a block"); open = 1; keep = chosen($NF); next }
      /^[ \t]*\/\/[ \t]*gen:else$/ { if (!open) fail("gen:else outside a block"); keep = !keep; next }
      /^[ \t]*\/\/[ \t]*gen:end$/ { if (!open) fail("gen:end outside a block"); open = 0; keep = 1; next }
      /gen:(if|else|end)/ { fail("a gen: line not of the forms above") }
      !keep { next }
      match($0, /^[ \t]*\/\/ gen> /) {
        if (!open) fail("gen> outside a block")
        $0 = substr($0, 1, RLENGTH - 8) substr($0, RLENGTH + 1)
      }
      { print }
      END { if (!failed && open) fail("a block not ended") }' "$1" | rename
  }
  template=$src/scripts/template
  while IFS= read -r -d '' f; do
    rel=${f#"$template"/}
    out=$(rename <<<"$rel")
    mkdir -p "$(dirname "$dst/$out")"
    render "$f" >"$dst/$out" || { echo "$0: cannot render $rel" >&2; exit 1; }
  done < <(find "$template/internal" "$template/cmd" -type f -print0)
  # The imports' order depends on the names: gofmt sorts them.
  if command -v gofmt >/dev/null; then gofmt -w "$dst/internal/$pkg" "$dst/cmd/$svc"; fi
fi

# ---------------------------------------------------------------- --bare

# fill FILE...: replaces the placeholders of the --bare files.
fill() {
  sed -i -e "s#@SVC@#$svc#g" -e "s#@PKG@#$pkg#g" -e "s#@EVENT@#$event#g" -e "s#@EVENTTYPE@#$Event#g" \
    -e "s#@EXCHANGE@#$exchange#g" -e "s#@ROUTING_KEY@#$routing_key#g" -e "s#@NAME@#$name#g" \
    -e "s#@DB@#$db#g" -e "s#@GO_VERSION@#$go_version#g" -e "s#@KIT@#$kit_module#g" "$@"
}

if ((bare)); then
  db=${svc//-/_}
  go_version=$(awk '$1 == "go" { print $2; exit }' "$src/go.mod")
  printf 'bin/\n*.test\n*.out\n.env\n' >"$dst/.gitignore"
  # The kit at a version, as any module: go mod tidy (below) adds what it
  # requires. The template's go.sum holds the hashes of the kit's
  # dependencies, checked where the template was; tidy drops the rest.
  printf 'module %s\n\ngo %s\n\nrequire %s %s\n' "$module" "$go_version" "$kit_module" "$kit_version" >"$dst/go.mod"
  cp "$src/go.sum" "$dst/go.sum"

  # The project's own files: scripts/template/bare, each FILE.tmpl with its
  # placeholders (@SVC@, …) filled.
  while IFS= read -r -d '' f; do
    rel=${f#"$src/scripts/template/bare/"}
    rel=${rel%.tmpl}
    mkdir -p "$(dirname "$dst/$rel")"
    cp "$f" "$dst/$rel"
    fill "$dst/$rel"
  done < <(find "$src/scripts/template/bare" -type f -name '*.tmpl' -print0)
  chmod +x "$dst/.ci/run"

  if command -v go >/dev/null; then
    # --kit-proxy: this checkout's kit, served at its version from a
    # file-based module proxy, ahead of the go command's own.
    if [[ -n $kit_proxy ]]; then
      proxy_dir=$(realpath -m -- "$kit_proxy")
      (cd "$src" && go run ./scripts/kitproxy -kit kit -out "$proxy_dir") ||
        { echo "$0: scripts/kitproxy could not serve the kit into $kit_proxy" >&2; exit 1; }
      GOPROXY="file://$proxy_dir,$(go env GOPROXY)"
      GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}$kit_module"
      export GOPROXY GONOSUMDB
    fi
    (cd "$dst" && go mod tidy && go run "./cmd/$svc" env >.env.example) || {
      echo "$0: go mod tidy or $svc env failed in $dst: is $kit_module@$kit_version served where GOPROXY looks? --kit-proxy DIR serves this checkout's kit" >&2
      exit 1
    }
  fi
fi

# Written: what follows only prints (a closed pipe must not undo the copy).
trap - EXIT INT TERM
cat <<EOF2
$dst is your copy, module $module.
Next:
  cd $(printf %q "$dir")
  git init && git add -A && git commit -m "From the RabbitMQ inbox consumer template"
  go build ./... && make test        # needs the local PostgreSQL and RabbitMQ (README)
EOF2
((bare)) || echo "Then write your handler: docs/writing-a-service.md (examples/shipping is one)."
if ((bare)); then
  echo "It requires the kit $kit_module $kit_version; an upgrade is: go get $kit_module@VERSION (its README)."
  [[ -z $kit_proxy ]] || echo "The kit is served from $proxy_dir: where it is not in the module cache yet, GOPROXY=file://$proxy_dir,\$(go env GOPROXY) GONOSUMDB=$kit_module"
fi
if [[ -n $svc ]]; then
  cat <<EOF2
The new service: internal/$pkg/$pkg.go (the TODOs), its migration in internal/$pkg/migrations/,
cmd/$svc/main.go; its test runs it against the local RabbitMQ and PostgreSQL:
  go test ./internal/$pkg
EOF2
fi
