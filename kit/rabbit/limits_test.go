package rabbit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// HeaderFrameSize counts what the broker counts: RabbitMQ takes a content
// header of exactly frame_max bytes and closes the connection on one byte
// more (501 FRAME_ERROR). CheckPublishing keeps 8 bytes below, as the AMQP
// specification counts the frame's own bytes in frame_max. Every kind of
// value the kit's stored headers come back as is in the table.
func TestHeaderFrameSizeIsWhatTheBrokerCounts(t *testing.T) {
	url := testenv.VHost(t)
	publish := func(msg amqp.Publishing) (frameMax int, err error) {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return conn.Config.FrameSize, rabbit.PublishConfirmed(ctx, ch, "", "q", msg)
	}
	msg := func(fill int) amqp.Publishing {
		return amqp.Publishing{
			ContentType: "application/json", MessageId: "m-1", DeliveryMode: amqp.Persistent, Timestamp: time.Now(),
			Headers: amqp.Table{"n": int64(7), "f": 1.5, "b": true, "nil": nil, "t": amqp.Table{"x": "y"},
				"a": []any{int64(1), "two", amqp.Table{"k": false}}, "fill": strings.Repeat("x", fill)},
			Body: []byte(`{}`),
		}
	}
	frameMax, err := publish(msg(0))
	if err != nil {
		t.Fatal(err)
	}
	fits := frameMax - 8 - rabbit.HeaderFrameSize(msg(0))
	if err := rabbit.CheckPublishing("", "q", msg(fits), frameMax); err != nil {
		t.Fatalf("a header frame of frame_max - 8 refused: %v", err)
	}
	if err := rabbit.CheckPublishing("", "q", msg(fits+1), frameMax); err == nil || !strings.Contains(err.Error(), "frame") {
		t.Fatalf("one byte over frame_max - 8: %v, want refused", err)
	}
	if _, err := publish(msg(fits + 8)); err != nil {
		t.Fatalf("the broker refused a header frame of HeaderFrameSize frame_max (%d): it counts less: %v", frameMax, err)
	}
	if _, err := publish(msg(fits + 9)); err == nil {
		t.Fatalf("the broker took a header frame of HeaderFrameSize frame_max + 1: it counts more")
	}
}
