-- +goose Up
-- charges is the fake gateway's idempotency store: one row per idempotency key.
-- A row is inserted 'in_flight' and committed before the charge is executed, so a
-- concurrent request with the same key sees it and gets 409; it becomes 'completed'
-- with the stored response that later requests with the key replay.
-- IF NOT EXISTS: databases migrated before each schema had its own version table.
CREATE TABLE IF NOT EXISTS charges (
    id              text        PRIMARY KEY,
    idempotency_key text        NOT NULL UNIQUE,
    request_sha256  bytea       NOT NULL,
    order_id        text        NOT NULL,
    customer_id     text        NOT NULL,
    amount_cents    bigint      NOT NULL,
    currency        char(3)     NOT NULL,
    state           text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    status          text        CHECK (status IN ('succeeded', 'declined')),
    decline_reason  text,
    response_code   integer,
    response_body   bytea,
    replays         integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz
);
CREATE INDEX IF NOT EXISTS charges_order_id_idx ON charges (order_id);

-- +goose Down
DROP TABLE charges;
