-- +goose Up
-- A gateway forgets an idempotency key some time after its charge completed
-- (KEY_TTL; Stripe after 24 hours). The row stays, since the charge happened,
-- but no longer holds its key: a later request with the key is a new charge,
-- a row of its own. So a key is unique among the rows not forgotten, and a
-- card charged twice through an expired key shows as two rows of one order.
ALTER TABLE charges ADD COLUMN forgotten_at timestamptz;
ALTER TABLE charges DROP CONSTRAINT charges_idempotency_key_key;
CREATE UNIQUE INDEX charges_idempotency_key_live ON charges (idempotency_key) WHERE forgotten_at IS NULL;

-- +goose Down
-- Fails while a key has a forgotten row and a live one.
DROP INDEX charges_idempotency_key_live;
ALTER TABLE charges ADD CONSTRAINT charges_idempotency_key_key UNIQUE (idempotency_key);
ALTER TABLE charges DROP COLUMN forgotten_at;
