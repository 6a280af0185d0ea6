-- +goose Up
-- The buffered inbox leases messages, as the outbox leases its rows: one
-- leased, per-key ordered queue for both (kit/internal/pgqueue holds its
-- rules and statements).
-- inbox_keys keeps only the order of each key (last_seq, next_seq); the
-- schedule moves to the messages:
--   - a message is due when it is pending, processing (its lease ended: its
--     holder died) or failed, and its available_at has passed;
--   - only a key's head (seq = next_seq) is ever due: the others wait at
--     available_at = 'infinity', beyond the range the claim scans, and the
--     settlement of the head (processed, skipped, dead-lettered) makes its
--     successor due;
--   - a parked head blocks its key by being parked: its successors stay at
--     infinity until an operator retries, skips or exports it.
-- A claim leases a message by moving its available_at to the lease's end
-- and setting its lease_token.
--
-- Stop every replica of the previous version before applying this: they
-- lease keys and would run beside this version's claims. The columns they
-- read are dropped, so one left running fails on its first statement
-- rather than taking a key twice.
ALTER TABLE inbox_messages ADD COLUMN lease_token bigint;

-- Each key's head takes the key's schedule and lease.
UPDATE inbox_messages m SET available_at = k.available_at, lease_token = k.lease_token
FROM inbox_keys k
WHERE m.consumer = k.consumer AND m.ordering_key = k.ordering_key AND m.seq = k.next_seq
    AND m.status IN ('pending', 'processing', 'failed');
-- The messages behind a head wait for it.
UPDATE inbox_messages m SET available_at = 'infinity'
FROM inbox_keys k
WHERE m.consumer = k.consumer AND m.ordering_key = k.ordering_key AND m.seq > k.next_seq
    AND m.status IN ('pending', 'processing', 'failed');

-- The claim: the due messages of a consumer, oldest due first. The waiting
-- ones are in it at infinity, past the end of every scan.
CREATE INDEX inbox_messages_due_idx ON inbox_messages (consumer, available_at)
    WHERE status IN ('pending', 'processing', 'failed');
DROP INDEX inbox_keys_due_idx;
DROP INDEX inbox_keys_blocked_idx;
-- updated_at goes too: the key's row changes only in its numbers now.
ALTER TABLE inbox_keys DROP COLUMN available_at, DROP COLUMN lease_token, DROP COLUMN blocked,
    DROP COLUMN updated_at;

-- +goose Down
ALTER TABLE inbox_keys ADD COLUMN available_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN lease_token bigint, ADD COLUMN blocked boolean NOT NULL DEFAULT false,
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
UPDATE inbox_keys k SET available_at = m.available_at, lease_token = m.lease_token, blocked = (m.status = 'parked')
FROM inbox_messages m
WHERE m.consumer = k.consumer AND m.ordering_key = k.ordering_key AND m.seq = k.next_seq;
UPDATE inbox_messages SET available_at = now() WHERE available_at = 'infinity';
CREATE INDEX inbox_keys_due_idx ON inbox_keys (consumer, available_at)
    WHERE NOT blocked AND next_seq <= last_seq;
CREATE INDEX inbox_keys_blocked_idx ON inbox_keys (consumer) WHERE blocked;
DROP INDEX inbox_messages_due_idx;
ALTER TABLE inbox_messages DROP COLUMN lease_token;
