-- +goose Up
-- inbox holds one row per message a consumer has applied. The primary key is the
-- dedupe: a second insert of the same (message_id, consumer) affects zero rows,
-- and a concurrent one waits for the first transaction and then affects zero rows.
-- IF NOT EXISTS: a database migrated before the inbox had a schema of its own
-- already holds this table.
CREATE TABLE IF NOT EXISTS inbox (
    message_id     text        NOT NULL CHECK (message_id <> ''),
    consumer       text        NOT NULL CHECK (consumer <> ''),
    payload_sha256 bytea       NOT NULL CHECK (octet_length(payload_sha256) = 32),
    received_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, consumer)
);
-- Retention prunes by age.
CREATE INDEX IF NOT EXISTS inbox_received_at_idx ON inbox (received_at);

-- +goose Down
DROP TABLE inbox;
