-- +goose Up
-- payments holds one row per order: the unique order_id stops a second payment
-- even when the same order arrives under another message id. The inbox table
-- is the kit's own schema (kit/migrations/inbox), applied before this one.
-- IF NOT EXISTS: a database migrated when both tables were one schema already
-- holds this table.
CREATE TABLE IF NOT EXISTS payments (
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
