#!/usr/bin/env bash
# The official postgres image's start-up, in short: as root, own the data
# directory and start again as postgres; as postgres, on an empty PGDATA run
# initdb, allow password logins from any address, create POSTGRES_DB, run
# /docker-entrypoint-initdb.d on a server that listens on the Unix socket only,
# then exec the real server.
set -Eeuo pipefail

if [[ ${1:-} == -* ]]; then set -- postgres "$@"; fi
if [[ ${1:-} != postgres ]]; then exec "$@"; fi

: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
export PGDATA

if [[ $(id -u) == 0 ]]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

log() { echo "docker-entrypoint: $*"; }

init_scripts() {
  local f
  for f in /docker-entrypoint-initdb.d/*; do
    case $f in
      *.sh)
        log "running $f"
        if [[ -x $f ]]; then
          "$f"
        else
          # shellcheck disable=SC1090 # the scripts of the mounted directory
          . "$f"
        fi
        ;;
      *.sql) log "running $f"; psql_init -f "$f" ;;
      *.sql.gz) log "running $f"; gunzip -c "$f" | psql_init ;;
      *) [[ -e $f ]] && log "ignoring $f" ;;
    esac
  done
}

psql_init() {
  psql -v ON_ERROR_STOP=1 --no-password --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" "$@"
}

if [[ ! -s $PGDATA/PG_VERSION ]]; then
  if [[ -z ${POSTGRES_PASSWORD:-} && $POSTGRES_HOST_AUTH_METHOD != trust ]]; then
    echo "docker-entrypoint: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
    exit 1
  fi
  log "initialising $PGDATA"
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of flags
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "${POSTGRES_PASSWORD:-}") \
    --encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-} >/dev/null
  printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
  printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
  # Unix socket only while the init scripts run: a TCP health check does not
  # pass before the databases exist.
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  export PGPASSWORD="${POSTGRES_PASSWORD:-}"
  if [[ $POSTGRES_DB != postgres ]]; then
    psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname postgres \
      --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db"' >/dev/null
  fi
  init_scripts
  unset PGPASSWORD
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  log "init done; starting PostgreSQL"
fi

exec "$@"
