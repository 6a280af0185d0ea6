package widget_test

import (
	// gen:if publishes
	"encoding/json"
	// gen:end
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// service is cmd/widget-service, built once and run as a process by each test, against
// the real RabbitMQ and PostgreSQL (kittest: a vhost and a database per test).
var service = kittest.NewProgram("../../cmd/widget-service")

func TestMain(m *testing.M) { os.Exit(kittest.RunMain(m)) }

func event(id, key string) amqp.Publishing {
	return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, `{"event_id":%q,"key":%q}`, id, key)}
}

// Duplicates (the same message id), the same key under a new message id and a
// poison message: one record per key,
// gen:if publishes
// one widget.recorded event on widget-events per record,
// gen:end
// gen:if ordered
// and the poison parked with its reason (a key of its own); each record is its
// key's first message's, one key's messages processed in order.
// gen:else
// and the poison in the dead-letter queue with its reason.
// gen:end
func TestRecordsEachKeyOnce(t *testing.T) {
	amqpURL, dbURL := kittest.VHost(t), kittest.Postgres(t)
	// Short retry delays, for a case of yours that fails and then succeeds.
	// gen:if ordered
	p := service.Start(t, "AMQP_URL="+amqpURL, "DATABASE_URL="+dbURL, "BUFFER_RETRY_DELAYS=100ms,500ms")
	// gen:else
	// gen> p := service.Start(t, "AMQP_URL="+amqpURL, "DATABASE_URL="+dbURL, "RETRY_DELAYS=100ms,500ms")
	// gen:end
	var msgs []amqp.Publishing
	for i := range 20 {
		key := fmt.Sprintf("k-%d", i)
		msgs = append(msgs, event("m-"+key, key), event("m-"+key, key)) // a producer's duplicate
		if i < 5 {
			msgs = append(msgs, event("again-"+key, key)) // the same key, a new message id
		}
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "poison", Body: []byte(`{"key":`)})
	// gen:if publishes
	// A queue of the test's own receives the service's events: an event
	// no queue takes is refused by the broker (the relay retries it).
	kittest.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare("widget-events", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("recorded", true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind("recorded", "widget.recorded", "widget-events", false, nil)
	})
	// gen:end
	kittest.Publish(t, amqpURL, "widgets", "widget.ordered", msgs...)

	// Every message settled: the records and the poison, and the
	// duplicates counted (they write nothing: the records can be all there
	// while the last duplicates are still in a worker).
	kittest.Eventually(t, time.Minute, "20 records, the poison settled and 25 duplicates counted", func() (bool, error) {
		// gen:if ordered
		records, parked := kittest.Count(t, dbURL, "SELECT count(*) FROM widget_records"),
			kittest.Count(t, dbURL, "SELECT count(*) FROM inbox_messages WHERE status = 'parked'")
		processed, dups := p.Metric(t, "consumer_messages_total", "outcome", "processed"), p.Metric(t, "consumer_messages_total", "outcome", "duplicate")
		if records != 20 || parked != 1 || processed < 20 || dups < 25 {
			return false, fmt.Errorf("%d records, %d parked, %v processed, %v duplicates so far", records, parked, processed, dups)
		}
		// gen:else
		// gen> records, dead := kittest.Count(t, dbURL, "SELECT count(*) FROM widget_records"), kittest.QueueDepth(t, amqpURL, "widget-service.widget-ordered.dlq")
		// gen> processed, dups := p.Metric(t, "consumer_messages_total", "outcome", "processed"), p.Metric(t, "consumer_messages_total", "outcome", "duplicate")
		// gen> if records != 20 || dead != 1 || processed < 20 || dups < 25 {
		// gen> 	return false, fmt.Errorf("%d records, %d dead letters, %v processed, %v duplicates so far", records, dead, processed, dups)
		// gen> }
		// gen:end
		return true, nil
	})
	// 20 processed; 25 duplicates: 20 with the same message id, 5 of the
	// same key under a new one.
	for outcome, want := range map[string]float64{"processed": 20, "duplicate": 25} {
		if n := p.Metric(t, "consumer_messages_total", "outcome", outcome); n != want {
			t.Errorf("consumer_messages_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	// gen:if ordered
	if n := kittest.Count(t, dbURL, "SELECT count(*) FROM inbox WHERE consumer = 'widget-service'"); n != 26 {
		t.Errorf("%d inbox rows, want 26 (one per message id, the poison's too: stored, then parked)", n)
	}
	if n := kittest.Count(t, dbURL, "SELECT count(*) FROM inbox_messages WHERE message_id = 'poison' AND park_reason = 'malformed_json'"); n != 1 {
		t.Errorf("%d poison messages parked with reason malformed_json, want 1", n)
	}
	// One key's messages in the order they were published: each record is
	// its key's first message's (m-k-3 before again-k-3), never a later one's.
	if n := kittest.Count(t, dbURL, "SELECT count(*) FROM widget_records WHERE message_id <> 'm-' || key"); n != 0 {
		t.Errorf("%d records made by a later message of their key, want each key's first", n)
	}
	// gen:else
	// gen> if n := kittest.Count(t, dbURL, "SELECT count(*) FROM inbox WHERE consumer = 'widget-service'"); n != 25 {
	// gen> 	t.Errorf("%d inbox rows, want 25 (one per message id but the poison)", n)
	// gen> }
	// gen> kittest.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
	// gen> 	d, ok, err := ch.Get("widget-service.widget-ordered.dlq", true)
	// gen> 	if err == nil && (!ok || d.MessageId != "poison" || d.Headers[kittest.HeaderDeadLetterReason] != "malformed_json") {
	// gen> 		t.Errorf("dead letter %q with reason %v, want poison with malformed_json", d.MessageId, d.Headers[kittest.HeaderDeadLetterReason])
	// gen> 	}
	// gen> 	return err
	// gen> })
	// gen:end
	// gen:if publishes
	// One event per record, at least once: the relay may publish one again
	// (a lost confirm), with the same message id, so the test counts keys.
	keys := map[string]bool{}
	kittest.Eventually(t, time.Minute, "an event for each of the 20 records", func() (bool, error) {
		kittest.WithChannel(t, amqpURL, func(ch *amqp.Channel) error {
			for {
				d, ok, err := ch.Get("recorded", true)
				if err != nil || !ok {
					return err
				}
				var e struct{ Key string }
				if err := json.Unmarshal(d.Body, &e); err != nil {
					return err
				}
				keys[e.Key] = true
			}
		})
		if len(keys) < 20 {
			return false, fmt.Errorf("events for %d keys so far", len(keys))
		}
		return true, nil
	})
	if len(keys) != 20 {
		t.Errorf("events for %d keys, want the 20 recorded", len(keys))
	}
	// gen:end
}
