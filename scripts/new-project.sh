#!/usr/bin/env bash
# new-project.sh: your own copy of this template, under your module path.
#
#   scripts/new-project.sh MODULE_PATH DIR
#   scripts/new-project.sh example.com/acme/shipping-service ../shipping-service
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
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
old_module=$(awk '$1 == "module" { print $2; exit }' "$here/go.mod")
# The names of this copy as they are now: a copy of a copy renames its own.
old_project=$(awk '$1 == "name:" { print $2; exit }' "$here/docker-compose.yml")
old_prefix=$(grep -m1 -oE '^ +image: [a-z0-9._-]+/[a-z0-9._-]+:dev$' "$here/docker-compose.yml" | sed -E 's#^ +image: ([^/]+)/.*#\1#')
[[ -n $old_module && -n $old_project && -n $old_prefix ]] ||
  { echo "$0: cannot read the module path, the Compose project or the image prefix of $here" >&2; exit 1; }

usage() {
  echo "usage: $0 MODULE_PATH DIR   (e.g. $0 example.com/acme/shipping-service ../shipping-service)" >&2
  exit 2
}
[[ $# -eq 2 ]] || usage
module=$1
dir=$2
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
mkdir -p "$dir"
dst=$(cd "$dir" && pwd)
[[ $dst != "$src" && $dst != "$src"/* ]] || { echo "$0: $dir is inside the template" >&2; exit 2; }

# tar keeps the modes: the scripts stay executable.
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    tar -C "$src" --null -T - -cf - | tar -C "$dst" -xf -
else
  tar -C "$src" --exclude=./bin --exclude=./.git -cf - . | tar -C "$dst" -xf -
fi

# Rename in every text file; binary files are left alone. An image name is the
# prefix before /<image>:<tag> (never a module path, which has no tag), after a
# space, a quote, = or : (a YAML key), as in `image: inbox-template/x:dev`.
image_re="(^|[[:space:]\"'=:])$old_prefix/([a-z0-9._-]+):"
while IFS= read -r -d '' f; do
  if grep -Iq . "$f" && grep -qE -e "$old_module" -e "$image_re" "$f"; then
    sed -i -E -e "s#$old_module#$module#g" -e "s#$image_re#\1$name/\2:#g" "$f"
  fi
done < <(find "$dst" -type f -not -path '*/.git/*' -print0)
sed -i -e "s#^name: $old_project\$#name: $name#" "$dst/docker-compose.yml"

left=$(grep -rIl --exclude-dir=.git -e "$old_module" "$dst" || true)
if [[ -n $left ]]; then
  printf '%s: these files still name %s:\n%s\n' "$0" "$old_module" "$left" >&2
  exit 1
fi

cat <<EOF2
$dst is your copy, module $module.
Next:
  cd $dir
  git init && git add -A && git commit -m "From the RabbitMQ inbox consumer template"
  go build ./... && make test        # needs the local PostgreSQL and RabbitMQ (README)
Then write your handler: docs/writing-a-service.md (examples/shipping is one).
EOF2
