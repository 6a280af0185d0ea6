-- +goose Up
-- shipments holds one row per paid order: the unique order_id makes the same
-- order under another message id a duplicate.
CREATE TABLE shipments (
    order_id   text        PRIMARY KEY,
    message_id text        NOT NULL,
    pickup_id  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE shipments;
