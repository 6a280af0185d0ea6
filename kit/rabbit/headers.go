package rabbit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HeadersJSON renders AMQP headers as a JSON object for a jsonb column (the
// buffered inbox's stored messages, the outbox).
// It never fails: strings, numbers, booleans, tables and arrays keep their
// shape; timestamps become RFC 3339 strings, byte arrays and other values
// their printed form. PostgreSQL's jsonb refuses the NUL character, so it is
// replaced.
func HeadersJSON(h map[string]any) string {
	if len(h) == 0 {
		return "{}"
	}
	b, err := json.Marshal(plain(map[string]any(h)))
	if err != nil { // plain leaves nothing json cannot encode; kept as a guard
		return "{}"
	}
	return string(b)
}

func plain(v any) any {
	switch v := v.(type) {
	case nil, bool, int8, int16, int32, int64, int, uint8, uint16, uint32, uint64:
		return v
	case float32:
		return plainFloat(float64(v))
	case float64:
		return plainFloat(v)
	case string:
		return strings.ReplaceAll(v, "\x00", "\uFFFD")
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case []byte:
		return plain(string(v))
	case amqp.Table:
		return plain(map[string]any(v))
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[strings.ReplaceAll(k, "\x00", "\uFFFD")] = plain(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = plain(x)
		}
		return out
	}
	return plain(fmt.Sprint(v))
}

func plainFloat(f float64) any {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Sprint(f)
	}
	return f
}

// HeadersFromJSON reads headers stored by HeadersJSON back as an AMQP table:
// whole numbers as int64, nested objects as tables, so that the headers can be
// published again (inboxctl inbox export, the outbox relay).
func HeadersFromJSON(raw []byte) (amqp.Table, error) {
	if len(raw) == 0 {
		return amqp.Table{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	return table(m), nil
}

func table(m map[string]any) amqp.Table {
	t := make(amqp.Table, len(m))
	for k, v := range m {
		t[k] = typed(v)
	}
	return t
}

func typed(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		return table(v)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = typed(x)
		}
		return out
	}
	return v
}
