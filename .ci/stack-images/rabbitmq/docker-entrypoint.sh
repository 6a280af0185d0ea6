#!/usr/bin/env bash
# As root, own the data directory, then run the server as rabbitmq.
set -Eeuo pipefail

if [[ ${1:-} == rabbitmq-server && $(id -u) == 0 ]]; then
  mkdir -p /var/lib/rabbitmq /var/log/rabbitmq
  chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /var/log/rabbitmq
  exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "${BASH_SOURCE[0]}" "$@"
fi
exec "$@"
