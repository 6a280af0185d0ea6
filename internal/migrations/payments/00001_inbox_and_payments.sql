-- +goose Up
-- inbox holds one row per message a consumer has applied. The primary key is the
-- dedupe: a second insert of the same (message_id, consumer) affects zero rows,
-- and a concurrent one waits for the first transaction and then affects zero rows.
CREATE TABLE inbox (
    message_id     text        NOT NULL CHECK (message_id <> ''),
    consumer       text        NOT NULL CHECK (consumer <> ''),
    payload_sha256 bytea       NOT NULL CHECK (octet_length(payload_sha256) = 32),
    received_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, consumer)
);
-- Retention prunes by age.
CREATE INDEX inbox_received_at_idx ON inbox (received_at);

-- payments holds one row per order: the unique order_id stops a second payment
-- even when the same order arrives under another message id.
CREATE TABLE payments (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id       text        NOT NULL UNIQUE,
    message_id     text        NOT NULL,
    customer_id    text        NOT NULL,
    amount_cents   bigint      NOT NULL CHECK (amount_cents > 0),
    currency       char(3)     NOT NULL,
    status         text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    charge_id      text        NOT NULL,
    decline_reason text,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE payments;
DROP TABLE inbox;
