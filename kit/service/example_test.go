package service_test

import (
	"context"
	"encoding/json"

	"gorm.io/gorm"

	"github.com/inbox-template/payment-service/kit/consumer"
	"github.com/inbox-template/payment-service/kit/outbox"
	"github.com/inbox-template/payment-service/kit/service"
)

// InvoiceDue is the event the example service consumes.
type InvoiceDue struct {
	EventID   string `json:"event_id"`
	InvoiceID string `json:"invoice_id"`
}

var reasonMalformedJSON = consumer.NewReason("malformed_json")

func decodeInvoiceDue(body []byte) (InvoiceDue, error) {
	var ev InvoiceDue
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, consumer.Permanent(reasonMalformedJSON, err)
	}
	return ev, nil
}

// reminders keeps what it needs of the Kit: the outbox, to emit from its
// writes in the inbox transaction.
type reminders struct{ outbox *outbox.Outbox }

func (h *reminders) Handle(_ context.Context, _ consumer.Message, ev InvoiceDue) (consumer.Writes, error) {
	return func(ctx context.Context, tx *gorm.DB) (consumer.Outcome, error) {
		body, err := json.Marshal(map[string]string{"invoice_id": ev.InvoiceID})
		if err != nil {
			return "", err
		}
		_, err = h.outbox.Enqueue(ctx, tx, outbox.Message{Exchange: "billing", RoutingKey: "reminder.sent", Body: body})
		return consumer.OutcomeProcessed, err
	}, nil
}

// A service is its description: Consume wires a handler typed to its event
// with the Events that decode it (a handler of another event does not
// compile). Its main is one line: ops.Run(ctx, Service(), os.Args[1:],
// os.Stdin, os.Stdout), which runs it, checks its configuration, migrates,
// and gives the operators' commands.
func ExampleConsume() {
	opts := service.Consume(service.Options{
		Name: "reminder-service", Event: "invoice-due", Exchange: "billing", RoutingKey: "invoice.due",
		Publishes: []string{"billing"},
	},
		consumer.Events[InvoiceDue]{Decode: decodeInvoiceDue, ID: func(e InvoiceDue) string { return e.EventID }},
		func(k *service.Kit) (*reminders, error) { return &reminders{outbox: k.Outbox}, nil })
	_ = opts
}
