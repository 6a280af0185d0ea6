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
# from the topic exchange X with the binding key K: internal/<pkg>/ (the
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
# Version this checkout's kit/kit.go declares; a kit upgrade is then
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
kit_release=$(sed -nE 's/^const Version = "([^"]+)"$/\1/p' "$here/kit/kit.go")
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
  echo "$0: --kit-proxy serves this checkout's kit, which is $kit_release (kit/kit.go), not --kit-version $kit_version" >&2
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
  case $(camel "$event") in
    Record | Handler | Service)
      echo "$0: --event $event: its type would collide with the generated $(camel "$event"); choose another name" >&2
      exit 2
      ;;
  esac
  for taken in "internal/$pkg" "cmd/$svc"; do
    [[ ! -e $here/$taken ]] || { echo "$0: --service $svc would write $taken, which the template has" >&2; exit 2; }
  done
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
image_re="(^|[[:space:]\"'=:])$old_prefix/([a-z0-9._-]+):"
while IFS= read -r -d '' f; do
  if grep -Iq . "$f" && grep -qE -e "$old_module" -e "$image_re" "$f"; then
    sed -i -E -e "s#$old_module#$module#g" -e "s#$image_re#\1$name/\2:#g" "$f"
  fi
done < <(find "$dst" -type f -not -path '*/.git/*' -print0)
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
  # The outside calls: guarded by default; --no-outside-calls declares none.
  if ((no_outside_calls)); then
    calls_contract="An outside call made here must be idempotent, with a key derived
//     from the business entity (ev.Key), never from the message or a fresh
//     one. This service was generated with --no-outside-calls: set
//     NoOutsideCalls to false in Service before Handle calls out, or nothing
//     keeps the retries within the callee's memory of the key."
    calls_todo="// TODO: the business logic. No outside call here while Service
	// declares NoOutsideCalls: true."
    calls_option="// true (generated with --no-outside-calls): the handler calls
		// nothing outside its database, so no idempotency key can expire:
		// no key-expiry guard, no replay age limit, IDEMPOTENCY_KEY_TTL
		// refused. Set it to false before Handle calls out, or a retry after
		// the callee forgot the key repeats the side effect.
		NoOutsideCalls: true,"
  else
    calls_contract="An outside call made here must be idempotent, with a key derived
//     from the business entity (ev.Key), never from the message or a fresh
//     one; the kit keeps the retries and dlq replay within
//     IDEMPOTENCY_KEY_TTL (default 24h: set it to what the service you call
//     promises), so that no retry comes after the callee forgot the key."
    calls_todo="// TODO: the business logic. An outside call goes here, before the
	// writes, with no transaction open."
    calls_option="// false: the handler may call out, and the kit keeps its retries
		// and dlq replay within IDEMPOTENCY_KEY_TTL, how long the services
		// it calls remember an idempotency key (the key-expiry guard). true
		// turns the guard off: only for a handler that calls nothing outside
		// its database (scripts/new-project.sh --no-outside-calls).
		NoOutsideCalls: false,"
  fi
  # The order: --ordered requires the buffered inbox, where a poison message
  # is parked (a key of its own) rather than dead-lettered, and a single
  # active consumer, without which two replicas may store one key's messages
  # in either order.
  if ((ordered)); then
    mode_option="// --ordered: one key's events are processed in the order they
		// were published (the Events' OrderingKey), so the service requires
		// the buffered inbox (INBOX_MODE=buffered: each message is stored
		// and acked at once, then processed from the table a key at a
		// time) and a single active consumer (SINGLE_ACTIVE_CONSUMER: one
		// replica consumes the queue at a time, so the replicas store one
		// key's messages in the broker's order; the broker fixes it when it
		// first declares the queue). A message that fails for good is
		// parked and blocks its key until an operator acts ($svc inbox
		// retry, skip or export); a body the decoder refuses is parked as
		// a key of its own.
		Requires: service.Requirements{Mode: service.ModeBuffered, SingleActiveConsumer: true},"
    poison_doc="the poison parked with its reason (a key of its own)"
    wire_import=""
    # shellcheck disable=SC2016 # Go source, its $table and $svc replaced below
    poison_wait='records, parked := testenv.Count(t, dbURL, "SELECT count(*) FROM $table"),
			testenv.Count(t, dbURL, "SELECT count(*) FROM inbox_messages WHERE status = '"'parked'"'")
		processed, dups := p.Metric(t, "consumer_messages_total", "outcome", "processed"), p.Metric(t, "consumer_messages_total", "outcome", "duplicate")
		if records != 20 || parked != 1 || processed < 20 || dups < 25 {
			return false, fmt.Errorf("%d records, %d parked, %v processed, %v duplicates so far", records, parked, processed, dups)
		}'
    inbox_rows='26 {
		t.Errorf("%d inbox rows, want 26 (one per message id, the poison'"'"'s too: stored, then parked)", n)'
    poison_check='if n := testenv.Count(t, dbURL, "SELECT count(*) FROM inbox_messages WHERE message_id = '"'poison'"' AND park_reason = '"'malformed_json'"'"); n != 1 {
		t.Errorf("%d poison messages parked with reason malformed_json, want 1", n)
	}'
  else
    mode_option="// Unordered: the inline inbox (INBOX_MODE, inline by default)
		// processes each message as its delivery waits. For one key's events
		// in the order they were published, require the buffered inbox and
		// a single active consumer:
		// Requires: service.Requirements{Mode: service.ModeBuffered, SingleActiveConsumer: true}
		// (scripts/new-project.sh --ordered)."
    poison_doc="the poison in the dead-letter queue with its reason"
    wire_import="
	\"$kit/wire\""
    # shellcheck disable=SC2016 # Go source, its $table and $svc replaced below
    poison_wait='records, dead := testenv.Count(t, dbURL, "SELECT count(*) FROM $table"), testenv.QueueDepth(t, amqpURL, "$svc.$event.dlq")
		processed, dups := p.Metric(t, "consumer_messages_total", "outcome", "processed"), p.Metric(t, "consumer_messages_total", "outcome", "duplicate")
		if records != 20 || dead != 1 || processed < 20 || dups < 25 {
			return false, fmt.Errorf("%d records, %d dead letters, %v processed, %v duplicates so far", records, dead, processed, dups)
		}'
    inbox_rows='25 {
		t.Errorf("%d inbox rows, want 25 (one per message id but the poison)", n)'
    # shellcheck disable=SC2016 # Go source
    poison_check='testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get("$svc.$event.dlq", true)
		if err == nil && (!ok || d.MessageId != "poison" || d.Headers[wire.HeaderDeadLetterReason] != "malformed_json") {
			t.Errorf("dead letter %q with reason %v, want poison with malformed_json", d.MessageId, d.Headers[wire.HeaderDeadLetterReason])
		}
		return err
	})'
  fi
  # The emission: --publishes X2 keeps k.Outbox and enqueues one event per
  # record in the writes; the test counts them on a queue of its own.
  if [[ -n $publishes ]]; then
    emit_imports="
	\"$kit/outbox\""
    emit_field="
	// outbox emits the service's events from the writes, in the inbox
	// transaction: the relay publishes them once committed.
	outbox *outbox.Outbox
"
    emit_writes="
		// The event goes out with the record: enqueued in this
		// transaction, published by the outbox relay after the commit,
		// confirmed by the broker, one key's events in order, at least
		// once (a consumer dedupes by its message id). An event no queue
		// is bound for is refused by the broker, retried and then parked
		// ($svc outbox parked, retry): bind the consumers' queues first,
		// or set Optional for an announcement nobody need take yet.
		body, err := json.Marshal(map[string]string{\"key\": ev.Key, \"message_id\": msg.ID})
		if err != nil {
			return \"\", err
		}
		if _, err := h.outbox.Enqueue(ctx, tx, outbox.Message{
			Exchange: \"$publishes\", RoutingKey: \"$pkg.recorded\", Body: body, OrderingKey: ev.Key,
		}); err != nil {
			return \"\", err
		}"
    emit_option="
		// The exchanges it emits to through k.Outbox (the relay declares
		// them).
		Publishes: []string{\"$publishes\"},"
    emit_new="&Handler{outbox: k.Outbox}"
    emit_doc=",
// and one $pkg.recorded event on $publishes per record"
    emit_bind="
	// A queue of the test's own receives the service's events: an event
	// no queue takes is refused by the broker (the relay retries it).
	testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(\"$publishes\", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(\"recorded\", true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(\"recorded\", \"$pkg.recorded\", \"$publishes\", false, nil)
	})"
    emit_test_imports="
	\"encoding/json\""
    emit_check="
	// One event per record, at least once: the relay may publish one again
	// (a lost confirm), with the same message id, so the test counts keys.
	keys := map[string]bool{}
	testenv.Eventually(t, time.Minute, \"an event for each of the 20 records\", func() (bool, error) {
		testenv.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
			for {
				d, ok, err := ch.Get(\"recorded\", true)
				if err != nil || !ok {
					return err
				}
				var e struct{ Key string }
				if err := json.Unmarshal(d.Body, &e); err != nil {
					return err
				}
				keys[e.Key] = true
			}
		})
		if len(keys) < 20 {
			return false, fmt.Errorf(\"events for %d keys so far\", len(keys))
		}
		return true, nil
	})
	if len(keys) != 20 {
		t.Errorf(\"events for %d keys, want the 20 recorded\", len(keys))
	}"
  else
    emit_imports="" emit_field="" emit_writes="" emit_option="" emit_new="&Handler{}" emit_doc="" emit_bind="" emit_check="" emit_test_imports=""
  fi
  poison_wait=${poison_wait//\$table/$table} poison_wait=${poison_wait//\$svc/$svc} poison_wait=${poison_wait//\$event/$event}
  poison_check=${poison_check//\$svc/$svc} poison_check=${poison_check//\$event/$event}
  mkdir -p "$dst/internal/$pkg/migrations" "$dst/cmd/$svc"

  cat >"$dst/internal/$pkg/$pkg.go" <<EOF2
// Package $pkg is $svc: it consumes $Event events from the $exchange
// exchange (binding key $routing_key) and records each one exactly once.
// Written by scripts/new-project.sh; the TODOs mark what is yours to write.
// The template's docs/writing-a-service.md explains every part, and its
// shipping example is a service with an outside call.
package $pkg

import (
	"context"
	"embed"
	"encoding/json"
	"log/slog"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"$kit/consumer"
	"$kit/migrations"$emit_imports
	"$kit/service"
)

// $Event is the event this service consumes. TODO: its fields, as the
// producer sends them.
type $Event struct {
	EventID string \`json:"event_id"\`
	// Key names the business entity the event is about (an order, an
	// account): the unique key of the service's effect, and the ordering key
	// of the buffered mode.
	Key string \`json:"key"\`
}

// Record is one row of the $table table: the service's effect, one per key.
type Record struct {
	Key       string \`gorm:"primaryKey"\`
	MessageID string
}

// TableName is the table the migration creates.
func (Record) TableName() string { return "$table" }

// The service's dead-letter (buffered: park) reasons, declared once: a word
// not of the form of one stops the program as it starts.
var (
	ReasonMalformedJSON = consumer.NewReason("malformed_json")
	ReasonMissingField  = consumer.NewReason("missing_field")
)

// Decode$Event decodes and validates a body. A body it refuses is
// dead-lettered (the buffered inbox: parked, a key of its own) with the
// reason given here, before any handler runs, and never retried: refuse here
// what no retry can fix.
func Decode$Event(body []byte) ($Event, error) {
	var ev $Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, consumer.Permanent(ReasonMalformedJSON, err)
	}
	if ev.Key == "" {
		return ev, consumer.Permanent(ReasonMissingField, nil)
	}
	return ev, nil
}

// Handler handles $Event events, on up to WORKERS goroutines at once. The
// contract (the kit keeps its side of it):
//   - Handle runs with no transaction open, at least once per message: a
//     redelivery after a crash runs it again, and so may a second replica.
//     $calls_contract
//   - An error from Handle or from the writes is retried with backoff and
//     then dead-lettered (the buffered mode: parked); one wrapped with
//     consumer.Permanent is dead-lettered (parked) at once with its reason. A fault of
//     the database is not the message's: it is put back without spending an
//     attempt.
//   - The writes run in the inbox transaction: everything through tx commits
//     together with the message's inbox row, or nothing does. They may run
//     again (a rolled-back batch is retried) or not at all (the inbox row
//     exists: a duplicate), so they touch nothing but tx.
//   - The writes return the outcome: OutcomeProcessed, or OutcomeDuplicate
//     when the effect was already there (the same key under another message
//     id); an empty outcome is refused. Nothing to write: consumer.NoWrites.
//   - One message id, one body: a message whose id was seen with other bytes
//     (a producer that re-serialized it) is dead-lettered payload_mismatch.
type Handler struct{$emit_field}

// Handle takes the event Service's Events made of the body (decoded once,
// before the handler runs) and returns its writes.
func (h *Handler) Handle(ctx context.Context, msg consumer.Message, ev $Event) (consumer.Writes, error) {
	$calls_todo
	return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&Record{Key: ev.Key, MessageID: msg.ID})
		switch {
		case res.Error != nil:
			return "", res.Error
		case res.RowsAffected == 0: // the same key under another message id
			return consumer.OutcomeDuplicate, nil
		}$emit_writes
		return consumer.OutcomeProcessed, nil
	}, nil
}

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Service describes $svc to the kit. Its queues are derived:
// $svc.$event, $svc.dlx, $svc.$event.dlq and the retry queues.
func Service() service.Options {
	return service.Consume(service.Options{
		Name:       "$svc",
		Event:      "$event",
		Exchange:   "$exchange",
		RoutingKey: "$routing_key",
		Migrations: []migrations.Set{migrations.NewSet("$svc", migrations.Must(migrationFiles, "migrations"))},
		LogAttrs: func(body []byte) []slog.Attr {
			var ev $Event
			if json.Unmarshal(body, &ev) != nil {
				return nil
			}
			return []slog.Attr{slog.String("key", ev.Key)}
		},
		$calls_option
		$mode_option$emit_option
	},
		// Each body is decoded once, before the handler runs; a body without
		// a message_id property is deduped by its event_id. The handler is
		// typed to the same event: one of another does not compile.
		consumer.Events[$Event]{
			Decode:      Decode$Event,
			ID:          func(e $Event) string { return e.EventID },
			OrderingKey: func(e $Event) string { return e.Key },
		},
		// k holds what a handler may keep: k.Reader for reads outside the
		// transaction, k.Outbox to emit events from the writes (with
		// Options.Publishes naming their exchanges), k.Config, k.Tracer.
		func(k *service.Kit) (consumer.HandlerOf[$Event], error) { return $emit_new, nil })
}
EOF2

  cat >"$dst/internal/$pkg/migrations/00001_$table.sql" <<EOF2
-- +goose Up
-- $table holds one row per key: the unique key makes the same entity under
-- another message id a duplicate. TODO: the service's own columns.
CREATE TABLE $table (
    key        text        PRIMARY KEY,
    message_id text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE $table;
EOF2

  cat >"$dst/cmd/$svc/main.go" <<EOF2
// Command $svc runs the $pkg service (internal/$pkg) on the kit: the
// consumer, and its operations commands (dlq, inbox; $svc help).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	app "$module/internal/$pkg"
	"$kit/ops"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := ops.Run(ctx, app.Service(), os.Args[1:], os.Stdin, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "$svc:", err)
		os.Exit(1)
	}
}
EOF2

  cat >"$dst/internal/$pkg/${pkg}_test.go" <<EOF2
package ${pkg}_test

import ($emit_test_imports
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"$kit/testenv"$wire_import
)

// service is cmd/$svc, built once and run as a process by each test, against
// the real RabbitMQ and PostgreSQL (testenv: a vhost and a database per test).
var service = testenv.NewProgram("../../cmd/$svc")

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }

func event(id, key string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, \`{"event_id":%q,"key":%q}\`, id, key)}
}

// Duplicates (the same message id), the same key under a new message id and a
// poison message: one record per key, $poison_doc$emit_doc.
func TestRecordsEachKeyOnce(t *testing.T) {
	amqpURL, dbURL := testenv.VHost(t), testenv.Postgres(t)
	p := service.Start(t, "AMQP_URL="+amqpURL, "DATABASE_URL="+dbURL, "RETRY_DELAYS=100ms,500ms")
	var msgs []amqp.Publishing
	for i := range 20 {
		key := fmt.Sprintf("k-%d", i)
		msgs = append(msgs, event("m-"+key, key), event("m-"+key, key)) // a producer's duplicate
		if i < 5 {
			msgs = append(msgs, event("again-"+key, key)) // the same key, a new message id
		}
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "poison", Body: []byte(\`{"key":\`)})$emit_bind
	testenv.Publish(t, amqpURL, "$exchange", "$routing_key", msgs...)

	// Every message settled: the records and the poison, and the
	// duplicates counted (they write nothing: the records can be all there
	// while the last duplicates are still in a worker).
	testenv.Eventually(t, time.Minute, "20 records, the poison settled and 25 duplicates counted", func() (bool, error) {
		$poison_wait
		return true, nil
	})
	// 20 processed; 25 duplicates: 20 with the same message id, 5 of the
	// same key under a new one.
	for outcome, want := range map[string]float64{"processed": 20, "duplicate": 25} {
		if n := p.Metric(t, "consumer_messages_total", "outcome", outcome); n != want {
			t.Errorf("consumer_messages_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	if n := testenv.Count(t, dbURL, "SELECT count(*) FROM inbox WHERE consumer = '$svc'"); n != $inbox_rows
	}
	$poison_check$emit_check
}
EOF2
  # The imports' order depends on the names: gofmt sorts them.
  if command -v gofmt >/dev/null; then gofmt -w "$dst/internal/$pkg" "$dst/cmd/$svc"; fi
fi

# ---------------------------------------------------------------- --bare

# fill FILE...: replaces the placeholders of the --bare files (written from
# quoted here-documents: nothing in them is expanded by the shell).
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

  cat >"$dst/README.md" <<'EOF2'
# @SVC@

A RabbitMQ consumer on the inbox kit: it consumes @EVENTTYPE@ events
from the `@EXCHANGE@` exchange (binding key `@ROUTING_KEY@`) with manual acks, and
applies each message's effect exactly once: its writes commit in one PostgreSQL
transaction with the message's inbox row, so a redelivery is found there and
suppressed; a message that cannot be processed goes to the dead-letter queue
`@SVC@.@EVENT@.dlq` with its reason (with the buffered inbox, `INBOX_MODE=buffered`:
it is parked in `inbox_messages`; `@SVC@ inbox parked` lists them).

- `internal/@PKG@/`: the service: the event and its decoder, the handler (its
  contract is its doc comment), `Service()`, the migration;
- `cmd/@SVC@/`: its main, which also carries the operations commands
  (`@SVC@ help`: `env`, `version`, `migrate`, `dlq`, `inbox`, `outbox`, `healthcheck`);
- the kit is a library, `@KIT@` at the version `go.mod` requires
  (`@SVC@ version` prints it): configuration, the consumer runtime (inline and
  buffered modes), the inbox, the outbox, retries and dead letters, metrics,
  health, shutdown. None of its source is here.

## Run it

Needs Go, PostgreSQL on `127.0.0.1:5432` (user `postgres`, trust auth) and RabbitMQ
on `127.0.0.1:5672` (`guest`/`guest`, with `rabbitmqctl`).

```sh
createdb -h 127.0.0.1 -U postgres @DB@
go run ./cmd/@SVC@            # every variable and its default: go run ./cmd/@SVC@ env
```

Or the whole stack, with Docker Compose: `docker compose up --build --wait`
(RabbitMQ, PostgreSQL and the service; `docker compose down -v` removes it).

## Test it

```sh
make test
```

gofmt, go vet, then every test with the race detector against the local broker and
database (each test makes its own vhost and database). CI runs `.ci/run`, which
starts both servers if they are down and then runs the same.

## Take a kit upgrade

```sh
go get @KIT@@v0.2.0 && go mod tidy
make test
```

The kit's release notes say what changed; `@SVC@ version` then prints the new
version. The go command fetches the kit through `GOPROXY` like any module. Where
it is not published (a fork, a network without the internet), serve it from a
module proxy of your own (the template's `scripts/kitproxy` writes a file-based
one from a checkout of the kit: `GOPROXY=file:///srv/goproxy,https://proxy.golang.org`
and `GONOSUMDB=@KIT@`). The kit comes from the module cache once fetched.

A team that must vendor runs `go mod vendor` after each upgrade and commits
`vendor/`: the go command and the Dockerfile then build from it, with no proxy.
EOF2

  cat >"$dst/Makefile" <<'EOF2'
# The test command CI runs is `make test`. It needs PostgreSQL on 127.0.0.1:5432
# (trust auth, user postgres) and RabbitMQ on 127.0.0.1:5672 (guest/guest) with
# rabbitmqctl on PATH: the tests create their own databases and vhosts.
GO  ?= go
BIN ?= bin
.PHONY: all build test check fmt vet clean
all: check build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...

test: check
	$(GO) test -race -count=1 -timeout 40m ./...

check: fmt vet

fmt:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
EOF2

  cat >"$dst/.ci/run" <<'EOF2'
#!/usr/bin/env bash
# CI entry point: make sure PostgreSQL and RabbitMQ are up, then run the
# README's test command. The tests create (and drop) their own databases and
# vhosts, named <prefix>_<run>_…: at the end this run removes what it left.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI=true

if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf "%f\n" | sort -n | tail -n1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 60); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; then
  rabbitmq-server -detached || true
  rabbitmqctl -q await_startup --timeout 120
fi

TEST_RUN_ID="ci$(date +%s)$$"
export TEST_RUN_ID
[[ ${TEST_NAME_PREFIX:-t} =~ ^[a-z][a-z0-9]{0,11}$ ]] || {
  echo "TEST_NAME_PREFIX='${TEST_NAME_PREFIX}': want a lowercase letter, then up to 11 lowercase letters and digits" >&2
  exit 2
}
cleanup_run() {
  for vh in $(rabbitmqctl -q list_vhosts name | grep "^${TEST_NAME_PREFIX:-t}_${TEST_RUN_ID}_" || true); do rabbitmqctl -q delete_vhost "$vh" || true; done
  for db in $(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "select datname from pg_database where datname like '${TEST_NAME_PREFIX:-t}\_${TEST_RUN_ID}\_%'"); do
    psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists \"$db\" with (force)" || true
  done
}
trap cleanup_run EXIT

make test
EOF2
  chmod +x "$dst/.ci/run"

  cat >"$dst/Dockerfile" <<'EOF2'
# The service's image: a static binary on distroless static.
#   docker build -t @NAME@/@SVC@:dev .
# It needs BuildKit (the cache mounts); Docker Compose builds with it. The
# modules come from vendor/ when it is there (go mod vendor), and otherwise
# through GOPROXY, which the kit must be served from: a build argument, with
# GONOSUMDB for a kit that is not published.
ARG GO_VERSION=@GO_VERSION@

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG GOPROXY=https://proxy.golang.org,direct
ARG GONOSUMDB=
WORKDIR /src
COPY . .
ARG TARGETOS TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/@SVC@

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/@SVC@ /usr/local/bin/
USER nonroot:nonroot
# /healthz, /readyz and /metrics.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/@SVC@"]
EOF2

  cat >"$dst/.dockerignore" <<'EOF2'
# The image is built from go.mod, go.sum, cmd/, internal/ and vendor/ only.
*
!go.mod
!go.sum
!cmd/
!internal/
!vendor/
**/*_test.go
**/testdata/
EOF2

  cat >"$dst/deploy/postgres/init-databases.sql" <<'EOF2'
-- Run by the postgres image's entrypoint once, when the data volume is empty.
-- @SVC@ creates its tables itself at start.
CREATE DATABASE @DB@;
EOF2

  cat >"$dst/docker-compose.yml" <<'EOF2'
# RabbitMQ, PostgreSQL and @SVC@.
#   docker compose up --build --wait
#   docker compose down -v
name: @NAME@

services:
  rabbitmq:
    image: rabbitmq:4.1-management
    hostname: rabbitmq
    restart: unless-stopped
    ports:
      - "127.0.0.1:${RABBITMQ_HOST_PORT:-5672}:5672"
      - "127.0.0.1:${RABBITMQ_UI_HOST_PORT:-15672}:15672"
    volumes:
      - rabbitmq-data:/var/lib/rabbitmq
      - ./deploy/rabbitmq/20-max-message-size.conf:/etc/rabbitmq/conf.d/20-max-message-size.conf:ro
    healthcheck:
      test: ["CMD", "rabbitmq-diagnostics", "-q", "ping"]
      interval: 5s
      timeout: 30s
      retries: 5
      start_period: 60s

  postgres:
    image: postgres:17
    restart: unless-stopped
    environment:
      POSTGRES_USER: postgres
      POSTGRES_PASSWORD: postgres
    ports:
      - "127.0.0.1:${POSTGRES_HOST_PORT:-5432}:5432"
    volumes:
      - postgres-data:/var/lib/postgresql/data
      - ./deploy/postgres/init-databases.sql:/docker-entrypoint-initdb.d/10-databases.sql:ro
    healthcheck:
      test: ["CMD", "pg_isready", "-h", "127.0.0.1", "-U", "postgres", "-d", "@DB@"]
      interval: 2s
      timeout: 5s
      retries: 5
      start_period: 120s

  @SVC@:
    image: @NAME@/@SVC@:dev
    build:
      context: .
    restart: unless-stopped
    environment:
      AMQP_URL: amqp://guest:guest@rabbitmq:5672/
      DATABASE_URL: postgres://postgres:postgres@postgres:5432/@DB@?sslmode=disable
      HTTP_ADDR: ":8080"
      LOG_LEVEL: ${LOG_LEVEL:-info}
    ports:
      - target: 8080
        host_ip: 127.0.0.1
    depends_on:
      rabbitmq:
        condition: service_healthy
      postgres:
        condition: service_healthy
    healthcheck:
      test: ["CMD", "/usr/local/bin/@SVC@", "healthcheck"]
      interval: 2s
      timeout: 5s
      retries: 3
      start_period: 120s
    stop_grace_period: 30s

volumes:
  rabbitmq-data:
  postgres-data:
EOF2
  fill "$dst/README.md" "$dst/Dockerfile" "$dst/deploy/postgres/init-databases.sql" "$dst/docker-compose.yml"

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
