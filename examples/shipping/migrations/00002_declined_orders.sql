-- +goose Up
-- declined_orders holds one row per order whose payment was declined: what
-- the shipping service will not ship. The unique order_id makes the same
-- order under another message id a duplicate.
CREATE TABLE declined_orders (
    order_id   text        PRIMARY KEY,
    message_id text        NOT NULL,
    reason     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE declined_orders;
