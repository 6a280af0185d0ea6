package rabbit

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ShortStringMax is AMQP 0-9-1's limit on a short string: an exchange or
// queue name, a routing key, a property such as the content type or the
// message id, and a header's name.
const ShortStringMax = 255

// CheckPublishing reports why a publish of msg to exchange with key could
// not be sent: a name, property or header name over ShortStringMax bytes, a
// header value of a type AMQP has not, or properties and headers that do
// not fit in one frame of frameMax bytes (the connection's negotiated
// frame_max; 0 checks no size). The client library refuses the first kinds
// only once it writes the frame, and the broker the last one on reading it,
// and either closes the whole connection (and with it every other publish in
// flight): check before publishing.
func CheckPublishing(exchange, key string, msg amqp.Publishing, frameMax int) error {
	for _, f := range [...]struct{ name, value string }{
		{"exchange", exchange}, {"routing key", key},
		{"content type", msg.ContentType}, {"content encoding", msg.ContentEncoding},
		{"correlation id", msg.CorrelationId}, {"reply to", msg.ReplyTo}, {"expiration", msg.Expiration},
		{"message id", msg.MessageId}, {"type", msg.Type}, {"user id", msg.UserId}, {"app id", msg.AppId},
	} {
		if len(f.value) > ShortStringMax {
			return fmt.Errorf("%s is %d bytes, over AMQP's %d", f.name, len(f.value), ShortStringMax)
		}
	}
	if err := msg.Headers.Validate(); err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	if err := checkHeaderNames(map[string]any(msg.Headers), ""); err != nil {
		return err
	}
	if n := HeaderFrameSize(msg); frameMax > 0 && n > frameMax-frameOverhead {
		return fmt.Errorf("properties and headers take %d bytes, over the %d of one frame (frame_max %d)", n, frameMax-frameOverhead, frameMax)
	}
	return nil
}

// frameOverhead is a frame's own bytes: type, channel, size, end marker.
const frameOverhead = 8

// HeaderFrameSize is the size of msg's content header as AMQP encodes it:
// the properties and the headers, which must fit in one frame.
func HeaderFrameSize(msg amqp.Publishing) int {
	n := 2 + 2 + 8 + 2 // class, weight, body size, property flags
	for _, s := range [...]string{msg.ContentType, msg.ContentEncoding, msg.CorrelationId, msg.ReplyTo,
		msg.Expiration, msg.MessageId, msg.Type, msg.UserId, msg.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(msg.Headers) > 0 {
		n += tableSize(msg.Headers)
	}
	if msg.DeliveryMode != 0 {
		n++
	}
	if msg.Priority != 0 {
		n++
	}
	if !msg.Timestamp.IsZero() {
		n += 8
	}
	return n
}

func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += 1 + len(k) + 1 + valueSize(v)
	}
	return n
}

// valueSize is a field value's encoded size, its type byte aside.
func valueSize(v any) int {
	switch v := v.(type) {
	case bool, byte, int8:
		return 1
	case int16, uint16:
		return 2
	case int, int32, uint32, float32:
		return 4
	case int64, float64, time.Time:
		return 8
	case amqp.Decimal:
		return 5
	case string:
		return 4 + len(v)
	case []byte:
		return 4 + len(v)
	case amqp.Table:
		return tableSize(v)
	case map[string]any:
		return tableSize(amqp.Table(v))
	case []any:
		n := 4
		for _, x := range v {
			n += 1 + valueSize(x)
		}
		return n
	}
	return 0
}

// CheckHeaderNames reports a header name, at any depth (a table in a table or
// in an array), over ShortStringMax bytes once stored (HeadersJSON writes a
// NUL as U+FFFD, three bytes).
func CheckHeaderNames(h map[string]any) error { return checkHeaderNames(h, "") }

func checkHeaderNames(v any, path string) error {
	switch v := v.(type) {
	case amqp.Table:
		return checkHeaderNames(map[string]any(v), path)
	case map[string]any:
		for k, x := range v {
			if n := storedLen(k); n > ShortStringMax {
				return fmt.Errorf("header name %s%.40q… is %d bytes, over AMQP's %d", path, k, n, ShortStringMax)
			}
			if err := checkHeaderNames(x, path+k+"."); err != nil {
				return err
			}
		}
	case []any:
		for i, x := range v {
			if err := checkHeaderNames(x, fmt.Sprintf("%s[%d].", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// storedLen is the length of s once HeadersJSON replaced each NUL.
func storedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			n += 2
		}
	}
	return n
}
