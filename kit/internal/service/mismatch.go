package service

import (
	"errors"
	"fmt"
	"strings"

	"github.com/inbox-template/payment-service/kit/rabbit"
)

// explainMismatch names the variable behind a queue or exchange argument the
// broker holds with another value (the runtime stops on it: no reconnect can
// mend it), with both values and the ways out.
func explainMismatch(cfg Config, err error) error {
	var m *rabbit.MismatchError
	if !errors.As(err, &m) {
		return err
	}
	if m.Kind == "queue" && m.Name == cfg.DeadLetterQueue && m.Arg == "x-queue-type" && m.Have == "'classic'" {
		return fmt.Errorf("DEAD_LETTER_QUEUE: the broker's queue %s is a 'classic' queue, declared by an earlier version of the template; "+
			"this one declares it a quorum queue, replicated like the others (a classic queue lives on one node). To upgrade: "+
			"stop every replica, empty it with inboxctl (dlq replay what should run again, dlq purge the rest), "+
			"delete it (rabbitmqctl delete_queue %s), and start again to declare it anew (docs/operations.md): %w",
			m.Name, m.Name, err)
	}
	variable, settable := mismatchVariable(cfg, m)
	fix := "set " + variable + " to match the broker, or migrate: "
	if !settable {
		fix = "it was declared by something other than this configuration (another program, an older version); migrate: "
	}
	return fmt.Errorf("%s: the broker's %s %s has %s %s, and this configuration declares %s. "+
		"A queue's or an exchange's arguments are fixed when it is first declared: %s"+
		"stop every replica, move or drain its messages, delete it (rabbitmqctl delete_queue or delete_exchange), "+
		"and start again to declare it anew: %w",
		variable, m.Kind, m.Name, m.Arg, m.Have, m.Want, fix, err)
}

// mismatchVariable is the variable whose value set the refused argument,
// and whether setting it to the broker's value mends it.
func mismatchVariable(cfg Config, m *rabbit.MismatchError) (string, bool) {
	switch {
	case m.Kind == "exchange" && m.Name == cfg.Exchange:
		return "EXCHANGE", false // its type: the kit declares a topic exchange
	case m.Kind == "exchange":
		return "DEAD_LETTER_EXCHANGE", false
	case m.Name == cfg.DeadLetterQueue:
		return "DEAD_LETTER_QUEUE", false
	case strings.HasPrefix(m.Name, cfg.Queue+".retry."):
		return "RETRY_DELAYS", false // a retry queue's arguments follow from its name
	}
	switch m.Arg {
	case "x-delivery-limit":
		return "QUEUE_DELIVERY_LIMIT", true
	case "x-dead-letter-exchange":
		return "DEAD_LETTER_EXCHANGE", true
	case "x-single-active-consumer":
		return "SINGLE_ACTIVE_CONSUMER", true
	}
	return "QUEUE", false // its type or an argument the kit always sets
}
