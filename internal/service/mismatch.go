package service

import (
	"errors"
	"fmt"
	"strings"

	"github.com/inbox-template/payment-service/internal/rabbit"
)

// explainMismatch names the variable behind a queue or exchange argument the
// broker holds with another value (the runtime stops on it: no reconnect can
// mend it), with both values and the ways out.
func explainMismatch(cfg Config, err error) error {
	var m *rabbit.MismatchError
	if !errors.As(err, &m) {
		return err
	}
	variable := mismatchVariable(cfg, m)
	return fmt.Errorf("%s: the broker's %s %s has %s %s, and this configuration declares %s. "+
		"A queue's arguments are fixed when it is first declared: set %s to match the broker, "+
		"or migrate: stop every replica, move or drain the queue's messages, delete it (rabbitmqctl delete_queue, delete_exchange), and start again to declare it anew "+
		"(a RabbitMQ policy can change delivery-limit and dead-letter-exchange of a live queue without a redeclare): %w",
		variable, m.Kind, m.Name, m.Arg, m.Have, m.Want, variable, err)
}

// mismatchVariable is the variable whose value set the refused argument.
func mismatchVariable(cfg Config, m *rabbit.MismatchError) string {
	switch {
	case m.Kind == "exchange" && m.Name == cfg.Exchange:
		return "EXCHANGE"
	case m.Kind == "exchange":
		return "DEAD_LETTER_EXCHANGE"
	case m.Name == cfg.DeadLetterQueue:
		return "DEAD_LETTER_QUEUE"
	case strings.HasPrefix(m.Name, cfg.Queue+".retry."):
		return "RETRY_DELAYS"
	}
	switch m.Arg {
	case "x-delivery-limit":
		return "QUEUE_DELIVERY_LIMIT"
	case "x-dead-letter-exchange":
		return "DEAD_LETTER_EXCHANGE"
	case "x-single-active-consumer":
		return "SINGLE_ACTIVE_CONSUMER"
	}
	return "QUEUE" // its type or an argument the kit always sets: declared by something else
}
