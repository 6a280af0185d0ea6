-- +goose Up
-- pickups holds one row per idempotency key: a booking the fake carrier took.
-- A key in flight (state in_flight) answers 409 until it completes or its
-- holder is presumed dead (claimed_at older than the takeover age); a
-- completed key replays its stored response; a key reused for another
-- request answers 422. One row per executed booking: two rows for one order
-- would be a pickup booked twice.
CREATE TABLE pickups (
    idempotency_key text        PRIMARY KEY,
    fingerprint     bytea       NOT NULL,
    order_id        text        NOT NULL,
    address         text        NOT NULL,
    pickup_id       text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    response        bytea,
    replays         integer     NOT NULL DEFAULT 0,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz
);
CREATE INDEX pickups_order_idx ON pickups (order_id);

-- +goose Down
DROP TABLE pickups;
