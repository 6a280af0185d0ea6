-- +goose Up
-- holds counts the times a pause the handler asked for (consumer.Pause)
-- released the message without spending an attempt: MAX_HOLDS bounds them,
-- and the message is parked held_too_often after that many. The runtime's
-- own releases (the database's trouble, a run of failures of many messages,
-- a lock wait) never count. An operator's retry resets it with attempts.
ALTER TABLE inbox_messages ADD COLUMN holds integer NOT NULL DEFAULT 0 CHECK (holds >= 0);

-- +goose Down
ALTER TABLE inbox_messages DROP COLUMN holds;
