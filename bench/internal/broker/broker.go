// Package broker is the bench's side of RabbitMQ: a vhost per configuration
// (through rabbitmqctl), the payment service's topology declared before the
// queue is pre-filled, and the queue counts a drain is judged by.
package broker

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/kittest/erlnode"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// The payment service's names and its work queue's delivery limit, at their
// defaults (internal/demo/config/payment.go of the template).
const (
	Exchange           = "orders"
	RoutingKey         = "order.placed"
	Queue              = "payments.order-placed"
	DeadLetterExchange = "payments.dlx"
	DeadLetterQueue    = "payments.order-placed.dlq"
	DeliveryLimit      = 20
	// EventsExchange is where the payment service's outbox publishes;
	// EventsSink takes and drops every event; EventsQueue takes OrderPaid
	// (OrderPaidKey) where a configuration measures the outbox's publishing.
	EventsExchange = "payments"
	EventsSink     = "bench.events"
	EventsQueue    = "bench.order-paid"
	OrderPaidKey   = "order.paid"
)

// QueueArgs are the work queue's arguments, as kit/rabbit/topology.go of
// the template declares them; that package is internal to the template's module,
// so the bench mirrors it. A drift cannot go unnoticed: RabbitMQ refuses the
// service's own declaration of a queue with other arguments
// (PRECONDITION_FAILED), and the service does not start.
func QueueArgs() amqp.Table {
	return amqp.Table{
		"x-queue-type":              "quorum",
		"x-overflow":                "reject-publish",
		"x-dead-letter-strategy":    "at-least-once",
		"x-dead-letter-exchange":    DeadLetterExchange,
		"x-dead-letter-routing-key": Queue,
		"x-delivery-limit":          int64(DeliveryLimit),
	}
}

// Declare creates what the pre-fill needs before any consumer runs (the
// work topology of DeclareWork), and a sink for the events the payment
// service emits through its outbox: OrderPaid is mandatory, so it needs a
// queue to be taken by; the sink keeps none.
func Declare(amqpURL string) error {
	return declare(amqpURL, append(workSteps(), sinkSteps()...))
}

// DeclareWork creates the exchange, the work queue bound to it, and the
// dead-letter exchange and queue. The service declares its retry queues
// itself at start.
func DeclareWork(amqpURL string) error { return declare(amqpURL, workSteps()) }

// DeclareEvents creates the exchange the payment service's outbox publishes
// to and EventsQueue bound to it for OrderPaid: a quorum queue, as
// shipping-service's is, so that every mandatory publish is routed and
// confirmed once the queue's log has it. maxLength 0 keeps every message
// (reject-publish overflow, as shipping-service's queue, never reached);
// above 0 the queue keeps the newest maxLength and drops the oldest
// (drop-head), so that the broker's memory stays bounded with no consumer.
func DeclareEvents(amqpURL string, maxLength int) error {
	return declare(amqpURL, eventsSteps(maxLength))
}

type step func(ch *amqp.Channel) error

func declare(amqpURL string, steps []step) error {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return fmt.Errorf("connect to declare the topology: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	for _, s := range steps {
		if err := s(ch); err != nil {
			return fmt.Errorf("declare the topology: %w", err)
		}
	}
	return nil
}

func workSteps() []step {
	return []step{
		func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		},
		func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil)
		},
		func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(Queue, true, false, false, false, QueueArgs())
			return err
		},
		func(ch *amqp.Channel) error {
			// As the kit declares it (rabbit.Topology): a quorum queue with
			// a limit no look reaches; another type would be refused.
			_, err := ch.QueueDeclare(DeadLetterQueue, true, false, false, false,
				amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(rabbit.DeadLetterDeliveryLimit)})
			return err
		},
		func(ch *amqp.Channel) error { return ch.QueueBind(Queue, RoutingKey, Exchange, false, nil) },
		func(ch *amqp.Channel) error {
			return ch.QueueBind(DeadLetterQueue, Queue, DeadLetterExchange, false, nil)
		},
	}
}

func declareEventsExchange(ch *amqp.Channel) error {
	return ch.ExchangeDeclare(EventsExchange, amqp.ExchangeTopic, true, false, false, false, nil)
}

func sinkSteps() []step {
	return []step{
		declareEventsExchange,
		func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(EventsSink, true, false, false, false,
				amqp.Table{"x-queue-type": "classic", "x-max-length": int64(0), "x-overflow": "drop-head"})
			return err
		},
		func(ch *amqp.Channel) error { return ch.QueueBind(EventsSink, "#", EventsExchange, false, nil) },
	}
}

func eventsSteps(maxLength int) []step {
	args := amqp.Table{"x-queue-type": "quorum", "x-overflow": "reject-publish"}
	if maxLength > 0 {
		args["x-overflow"], args["x-max-length"] = "drop-head", int64(maxLength)
	}
	return []step{
		declareEventsExchange,
		func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(EventsQueue, true, false, false, false, args)
			return err
		},
		func(ch *amqp.Channel) error {
			return ch.QueueBind(EventsQueue, OrderPaidKey, EventsExchange, false, nil)
		},
	}
}

// Ready is the number of ready messages in queue: not delivered, or delivered
// and requeued. Unacknowledged deliveries are not counted; Ctl.Counts has both.
func Ready(ch *amqp.Channel, queue string) (int, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	return q.Messages, nil
}

// Ctl runs rabbitmqctl, or evaluates the same on the broker's node through
// erl_call where it reaches it (erlnode): a rabbitmqctl call boots an
// Erlang VM, about 1 s of CPU, and a smoke run made about 60.
type Ctl struct {
	command []string
	node    *erlnode.Node // nil: rabbitmqctl
}

// NewCtl takes the command line that runs rabbitmqctl, e.g. "sudo
// rabbitmqctl", and the broker's AMQP URL: with the plain "rabbitmqctl", a
// node on this machine that erl_call reaches is asked that way instead.
func NewCtl(command, amqpURL string) Ctl {
	c := Ctl{command: strings.Fields(command)}
	if command == "rabbitmqctl" {
		if n, ok := erlnode.Of(amqpURL); ok {
			c.node = &n
		}
	}
	return c
}

// plain is what an Erlang binary takes unquoted.
var plain = regexp.MustCompile(`^[A-Za-z0-9_.@-]+$`)

// evaluate returns expr's value on the node, or ok false where it cannot
// ask the node: no erl_call, or a name that is not plain.
func (c Ctl) evaluate(expr string, names ...string) (value string, ok bool, err error) {
	if c.node == nil {
		return "", false, nil
	}
	for _, n := range names {
		if !plain.MatchString(n) {
			return "", false, nil
		}
	}
	value, err = c.node.Result(expr)
	return value, true, err
}

func (c Ctl) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.command[0], append(c.command[1:], args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", strings.Join(c.command, " "), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// AddVHost creates vhost, grants the user of base every permission on it, and
// returns base's URL pointed into it.
func (c Ctl) AddVHost(ctx context.Context, base, vhost string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parse AMQP URL: %w", err)
	}
	user := u.User.Username()
	u.Path = "/" + vhost
	if _, ok, err := c.evaluate(fmt.Sprintf(`ok = rabbit_vhost:add(<<"%s">>, <<"bench">>), `+
		`ok = rabbit_auth_backend_internal:set_permissions(<<"%s">>, <<"%s">>, <<".*">>, <<".*">>, <<".*">>, <<"bench">>), ok.`,
		vhost, user, vhost), vhost, user); ok {
		return u.String(), err
	}
	if _, err := c.run(ctx, "add_vhost", vhost); err != nil {
		return "", err
	}
	if _, err := c.run(ctx, "set_permissions", "-p", vhost, user, ".*", ".*", ".*"); err != nil {
		return "", err
	}
	return u.String(), nil
}

// DeleteVHost deletes vhost with everything in it.
func (c Ctl) DeleteVHost(ctx context.Context, vhost string) error {
	if _, ok, err := c.evaluate(fmt.Sprintf(`ok = rabbit_vhost:delete(<<"%s">>, <<"bench">>), ok.`, vhost), vhost); ok {
		return err
	}
	_, err := c.run(ctx, "delete_vhost", vhost)
	return err
}

// Counts returns the ready and unacknowledged messages of queue in vhost.
func (c Ctl) Counts(ctx context.Context, vhost, queue string) (ready, unacked int, err error) {
	if res, ok, err := c.evaluate(fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"%s">>, queue, <<"%s">>)), `+
		`[{_, R}, {_, U}] = rabbit_amqqueue:info(Q, [messages_ready, messages_unacknowledged]), {R, U}.`, vhost, queue), vhost, queue); ok {
		if err != nil {
			return 0, 0, err
		}
		if _, err := fmt.Sscanf(res, "{%d, %d}", &ready, &unacked); err != nil {
			return 0, 0, fmt.Errorf("erl_call: queue counts of %s in %s: %q", queue, vhost, res)
		}
		return ready, unacked, nil
	}
	out, err := c.run(ctx, "list_queues", "-q", "--no-table-headers", "-p", vhost, "name", "messages_ready", "messages_unacknowledged")
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != queue {
			continue
		}
		r, err1 := strconv.Atoi(f[1])
		u, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("list_queues: unexpected line %q", line)
		}
		return r, u, nil
	}
	return 0, 0, fmt.Errorf("list_queues: no queue %s in vhost %s", queue, vhost)
}
