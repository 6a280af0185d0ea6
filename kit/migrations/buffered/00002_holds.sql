-- +goose Up
-- holds counts the times a pause the handler asked for (consumer.Pause)
-- released the message without spending an attempt: MAX_HOLDS bounds them,
-- and the message is parked held_too_often after that many. The runtime's
-- own releases (the database's trouble, a run of failures of many messages,
-- a lock wait) never count. An operator's retry resets it with attempts.
-- The column's default is a constant, so adding it rewrites nothing; its
-- check is NOT VALID, so adding it reads nothing either (a check on the new
-- column would scan every stored message under the table's exclusive lock:
-- 354 ms a million rows, blocking the replicas of the version before). New
-- and updated rows are checked; the existing ones hold the default.
ALTER TABLE inbox_messages ADD COLUMN holds integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT inbox_messages_holds_check CHECK (holds >= 0) NOT VALID;

-- +goose Down
ALTER TABLE inbox_messages DROP COLUMN holds;
