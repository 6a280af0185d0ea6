-- +goose Up
-- The buffered inbox (INBOX_MODE=buffered): a delivery is stored and acked at
-- once, and processed later from these tables in order per ordering key. The
-- inbox table (the inbox set) still dedupes the message ids at ingest. A service in
-- inline mode leaves both tables empty.

-- inbox_keys has one row per ordering key: the per-key sequence (last_seq, the
-- newest message stored) and the pointer to the next one to process
-- (next_seq). A key is due when it has a message to process (next_seq <=
-- last_seq), its head is not parked (blocked) and available_at has passed.
-- A claim leases the key by moving available_at to the lease's end and setting
-- lease_token; so a lease that expires (its holder crashed) makes the key due
-- again without any sweeper, and one index answers "which keys are due".
CREATE TABLE inbox_keys (
    consumer     text        NOT NULL CHECK (consumer <> ''),
    ordering_key text        NOT NULL CHECK (ordering_key <> ''),
    last_seq     bigint      NOT NULL CHECK (last_seq >= 0),
    next_seq     bigint      NOT NULL DEFAULT 1 CHECK (next_seq >= 1 AND next_seq <= last_seq + 1),
    available_at timestamptz NOT NULL DEFAULT now(),
    lease_token  bigint,
    blocked      boolean     NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, ordering_key)
);
-- The claim: the due keys of a consumer, oldest first. Only keys with work
-- and no parked head are in it, so neither idle nor blocked keys are scanned.
CREATE INDEX inbox_keys_due_idx ON inbox_keys (consumer, available_at)
    WHERE NOT blocked AND next_seq <= last_seq;
-- The blocked-key count of the metrics and of inboxctl inbox status.
CREATE INDEX inbox_keys_blocked_idx ON inbox_keys (consumer) WHERE blocked;

-- inbox_messages holds each stored message and its status:
--   pending → processing → processed
--   failed: a run failed and attempts are left (available_at: the next try)
--   parked: the retry budget is spent or the error is permanent; the head of
--           its key, which it blocks until an operator retries, skips or
--           exports it (inboxctl inbox retry / skip / export)
--   skipped, dead_lettered: what an operator's skip and export leave behind.
-- processed, skipped and dead_lettered rows are pruned after INBOX_RETENTION.
CREATE TABLE inbox_messages (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer      text        NOT NULL CHECK (consumer <> ''),
    message_id    text        NOT NULL CHECK (message_id <> ''),
    ordering_key  text        NOT NULL CHECK (ordering_key <> ''),
    seq           bigint      NOT NULL CHECK (seq >= 1),
    status        text        NOT NULL DEFAULT 'pending' CHECK (status IN
                      ('pending', 'processing', 'processed', 'failed', 'parked', 'skipped', 'dead_lettered')),
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0), -- runs of the retry budget
    runs          integer     NOT NULL DEFAULT 0 CHECK (runs >= 0),     -- every claim, never reset
    available_at  timestamptz NOT NULL DEFAULT now(),
    received_at   timestamptz NOT NULL DEFAULT now(),
    claimed_at    timestamptz,
    parked_at     timestamptz,
    finished_at   timestamptz,
    outcome       text,
    last_error    text,
    park_reason   text,
    content_type  text        NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}',
    body          bytea       NOT NULL,
    published_at  timestamptz,
    UNIQUE (consumer, ordering_key, seq)
);
-- Operators look messages up by id (inboxctl inbox retry --id).
CREATE INDEX inbox_messages_message_id_idx ON inbox_messages (consumer, message_id);
-- The status counts and the oldest unfinished message, without the processed rows.
CREATE INDEX inbox_messages_unfinished_idx ON inbox_messages (consumer, status, received_at)
    WHERE status IN ('pending', 'processing', 'failed', 'parked');
-- Retention prunes finished rows by age.
CREATE INDEX inbox_messages_finished_idx ON inbox_messages (consumer, finished_at)
    WHERE status IN ('processed', 'skipped', 'dead_lettered');

-- +goose Down
DROP TABLE inbox_messages;
DROP TABLE inbox_keys;
