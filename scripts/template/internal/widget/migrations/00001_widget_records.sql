-- +goose Up
-- widget_records holds one row per key: the unique key makes the same entity under
-- another message id a duplicate. TODO: the service's own columns.
CREATE TABLE widget_records (
    key        text        PRIMARY KEY,
    message_id text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE widget_records;
