package service

import (
	"encoding/json"
	"log/slog"
)

// JSONField returns a KeyFromBody that reads the top-level string field name
// of a JSON body: the dedupe key of a message published without a message_id
// property (an event_id, say). It returns "" for anything it cannot read.
func JSONField(name string) func(body []byte) string {
	return func(body []byte) string {
		var fields map[string]json.RawMessage
		var v string
		if json.Unmarshal(body, &fields) != nil || json.Unmarshal(fields[name], &v) != nil {
			return ""
		}
		return v
	}
}

// JSONAttrs returns a LogAttrs that puts the top-level string fields names of a
// JSON body (an order id, say) on every log line about a message, and in
// `dlq list`. A field it cannot read is left out.
func JSONAttrs(names ...string) func(body []byte) []slog.Attr {
	return func(body []byte) []slog.Attr {
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil {
			return nil
		}
		var attrs []slog.Attr
		for _, name := range names {
			var v string
			if json.Unmarshal(fields[name], &v) == nil && v != "" {
				attrs = append(attrs, slog.String(name, v))
			}
		}
		return attrs
	}
}
