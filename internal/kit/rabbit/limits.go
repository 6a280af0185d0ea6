package rabbit

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ShortStringMax is AMQP 0-9-1's limit on a short string: an exchange or
// queue name, a routing key, a property such as the content type or the
// message id, and a header's name.
const ShortStringMax = 255

// CheckPublishing reports why a publish of msg to exchange with key could
// not be sent: a name, property or header name over ShortStringMax bytes, or
// a header value of a type AMQP has not. The client library refuses such a
// frame only once it writes it, and then closes the whole connection (and
// with it every other publish in flight): check before publishing.
func CheckPublishing(exchange, key string, msg amqp.Publishing) error {
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
	return checkHeaderNames(map[string]any(msg.Headers), "")
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
