-- +goose Up
-- The transactional outbox: a handler's outgoing messages, written in the
-- inbox transaction with its business writes (they commit together or not at
-- all), and published by the relay of any replica with publisher confirms.
-- A row leaves the pending set only after the broker confirmed it.
--
-- outbox_keys orders the messages of one ordering key: last_seq is the key's
-- newest message, next_seq the first not yet sent. Enqueue takes the key's
-- next sequence number under this row's lock, held to the commit, so the
-- numbers of one key follow the commit order and have no gaps.
CREATE TABLE outbox_keys (
    producer     text   NOT NULL CHECK (producer <> ''),
    ordering_key text   NOT NULL CHECK (ordering_key <> ''),
    last_seq     bigint NOT NULL CHECK (last_seq >= 1),
    next_seq     bigint NOT NULL DEFAULT 1 CHECK (next_seq >= 1 AND next_seq <= last_seq + 1),
    PRIMARY KEY (producer, ordering_key)
);

-- outbox holds each message and its status:
--   pending → sent
--   parked: its publish failed max_attempts times (unroutable, refused); an
--           ordered one blocks its key until an operator retries it
--           (outbox retry).
-- A pending row is due when available_at has passed. An ordered row that is
-- not its key's head waits at available_at = 'infinity', beyond the range
-- the claim scans, and the mark of a head as sent makes its successor due. A claim leases rows by moving available_at to the lease's end
-- (lease_token says whose), so a relay that died gives them back by itself.
-- Sent rows are pruned after INBOX_RETENTION; unsent rows never.
CREATE TABLE outbox (
    id           uuid        PRIMARY KEY, -- assigned at insert; the AMQP message_id of every publish
    producer     text        NOT NULL CHECK (producer <> ''),
    exchange     text        NOT NULL,
    routing_key  text        NOT NULL,
    content_type text        NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    body         bytea       NOT NULL,
    mandatory    boolean     NOT NULL DEFAULT true, -- a publish no queue takes is a failure
    ordering_key text,
    seq          bigint,
    status       text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'parked')),
    attempts     integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    available_at timestamptz NOT NULL DEFAULT now(),
    lease_token  bigint,
    last_error   text,
    park_reason  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz,
    parked_at    timestamptz,
    CHECK ((ordering_key IS NULL) = (seq IS NULL)),
    UNIQUE (producer, ordering_key, seq)
);
-- The claim: due rows of a producer, oldest first.
CREATE INDEX outbox_due_idx ON outbox (producer, available_at) WHERE status = 'pending';
-- The gauges and outbox status: the oldest unsent, the parked.
CREATE INDEX outbox_unsent_idx ON outbox (producer, status, created_at) WHERE status <> 'sent';
-- Retention prunes sent rows by age.
CREATE INDEX outbox_sent_idx ON outbox (producer, sent_at) WHERE status = 'sent';

-- +goose Down
DROP TABLE outbox;
DROP TABLE outbox_keys;
