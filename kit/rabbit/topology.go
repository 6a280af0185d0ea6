package rabbit

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology is everything one consumer needs on the broker. Declaring it is
// idempotent, so every replica declares it at every (re)connect.
type Topology struct {
	Exchange           string // topic exchange the producer publishes to
	RoutingKey         string
	Queue              string // quorum work queue
	DeadLetterExchange string
	DeadLetterQueue    string
	// DeliveryLimit is the broker's last line of defence: a message redelivered this
	// many times (a crash loop) is dead-lettered by RabbitMQ itself.
	DeliveryLimit int
	RetryDelays   []time.Duration
	// SingleActive declares the work queue with x-single-active-consumer:
	// the broker delivers to one consumer at a time, in queue order, and
	// fails over to the next when it goes. A queue's arguments are fixed when
	// it is first declared: declaring it again with another value fails with
	// PRECONDITION_FAILED, so changing this means deleting the queue.
	SingleActive bool
	// QuorumGroupSize is the number of nodes that hold a replica of each of
	// the queues (x-quorum-initial-group-size); 0 leaves it to the broker,
	// whose default (quorum_cluster_size) is 3, or every node of a smaller
	// cluster. Like SingleActive it is fixed when a queue is first declared.
	QuorumGroupSize int
	// MoreBindings are those of a service's further events
	// (kit.ConsumeAlso): the work queue is bound with each, its exchange
	// declared as Exchange is.
	MoreBindings []Binding
}

// Binding is an exchange and a binding key the work queue is bound with.
type Binding struct {
	// Exchange is a topic exchange ("" in kit.ConsumeAlso: the service's).
	Exchange string
	// Key is a topic pattern: "*" stands for one word, "#" for any number.
	Key string
}

// DeadLetterKey is the routing key that reaches DeadLetterQueue.
func (t Topology) DeadLetterKey() string { return t.Queue }

// RetryQueue names the delay queue for one retry delay, e.g. "payments.order-placed.retry.5s".
func (t Topology) RetryQueue(delay time.Duration) string {
	if delay%time.Second == 0 {
		return fmt.Sprintf("%s.retry.%ds", t.Queue, delay/time.Second)
	}
	return fmt.Sprintf("%s.retry.%dms", t.Queue, delay/time.Millisecond)
}

// quorum are the arguments of every queue we own. At-least-once dead-lettering
// (RabbitMQ 3.10+) keeps a message in its queue until the dead-letter target
// has confirmed it; it requires reject-publish overflow.
func (t Topology) quorum(extra amqp.Table) amqp.Table {
	args := amqp.Table{
		"x-queue-type":           "quorum",
		"x-overflow":             "reject-publish",
		"x-dead-letter-strategy": "at-least-once",
	}
	for k, v := range extra {
		args[k] = v
	}
	t.sized(args)
	return args
}

func (t Topology) sized(args amqp.Table) {
	if t.QuorumGroupSize > 0 {
		args["x-quorum-initial-group-size"] = int64(t.QuorumGroupSize)
	}
}

// DeadLetterDeliveryLimit is the dead-letter queue's x-delivery-limit: so
// high that no number of looks (deadletter.Queue.List returns what it took,
// and each return counts) ever reaches it. RabbitMQ 4.x gives every quorum
// queue a limit of 20 by default; "-1", which lifts it on 4.x, drops a
// message at its first return on 3.10 (seen here): a number works on both.
const DeadLetterDeliveryLimit = 100_000_000

func (t Topology) deadLetterArgs() amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(DeadLetterDeliveryLimit)}
	t.sized(args)
	return args
}

func (t Topology) workArgs() amqp.Table {
	args := amqp.Table{
		"x-dead-letter-exchange":    t.DeadLetterExchange,
		"x-dead-letter-routing-key": t.DeadLetterKey(),
		"x-delivery-limit":          int64(t.DeliveryLimit),
	}
	if t.SingleActive {
		args["x-single-active-consumer"] = true
	}
	return args
}

// Declare creates the exchanges, queues and bindings.
//
// Retry queues have no consumer: a message waits there for the queue's TTL and is
// then dead-lettered through the default exchange straight back to the work
// queue (not through the topic exchange, which would also reach other consumers).
// This needs no broker plugin and behaves the same on RabbitMQ 3.10 and 4.x.
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return declareError("exchange", t.Exchange, err)
	}
	if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return declareError("exchange", t.DeadLetterExchange, err)
	}
	queues := []struct {
		name string
		args amqp.Table
	}{
		{t.Queue, t.quorum(t.workArgs())},
		// The dead-letter queue is a quorum queue too, replicated like the
		// others: a classic queue lives on one node, and while that node is
		// down the broker refuses to declare it, which would keep every
		// consumer from starting anywhere in the cluster. It has no
		// dead-letter target of its own, and a limit no look reaches
		// (DeadLetterDeliveryLimit).
		{t.DeadLetterQueue, t.deadLetterArgs()},
	}
	for _, d := range t.RetryDelays {
		queues = append(queues, struct {
			name string
			args amqp.Table
		}{t.RetryQueue(d), t.quorum(amqp.Table{
			"x-message-ttl":             d.Milliseconds(),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": t.Queue,
		})})
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			return declareError("queue", q.name, err)
		}
	}
	for _, b := range append([]Binding{{t.Exchange, t.RoutingKey}}, t.MoreBindings...) {
		if b.Exchange != t.Exchange {
			if err := ch.ExchangeDeclare(b.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
				return declareError("exchange", b.Exchange, err)
			}
		}
		if err := ch.QueueBind(t.Queue, b.Key, b.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s with %s: %w", t.Queue, b.Exchange, b.Key, err)
		}
	}
	if err := ch.QueueBind(t.DeadLetterQueue, t.DeadLetterKey(), t.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("bind %s to %s: %w", t.DeadLetterQueue, t.DeadLetterExchange, err)
	}
	return nil
}

// MismatchError says the broker holds a queue or exchange of ours declared
// with another value of one of its arguments (or another type): RabbitMQ
// refuses to declare it again (PRECONDITION_FAILED) and closes the channel.
// Reconnecting cannot help: the configuration or the broker must change.
type MismatchError struct {
	Kind string // "queue" or "exchange"
	Name string
	Arg  string // "x-delivery-limit", or "type" for an exchange's kind
	Want string // the value we declared, as the broker printed it
	Have string // the broker's, or "none"
	Err  error
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s %s exists with %s %s, and this configuration declares it with %s", e.Kind, e.Name, e.Arg, e.Have, e.Want)
}

// Unwrap returns the broker's error.
func (e *MismatchError) Unwrap() error { return e.Err }

// inequivalent parses the broker's text of a refused redeclare. RabbitMQ
// reports the argument and both values only in the text of its error
// (3.10: "received '5' but current is '20'", or "received the value 'true'
// of type 'bool' but current is none"), and AMQP has no way to read a
// queue's arguments: the text is all there is.
var inequivalent = regexp.MustCompile(`inequivalent arg '([^']+)' for (?:queue|exchange) '(?:[^']*)' in vhost '(?:[^']*)': received (.+) but current is (.+)$`)

func declareError(kind, name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		if m := inequivalent.FindStringSubmatch(ae.Reason); m != nil {
			return &MismatchError{Kind: kind, Name: name, Arg: m[1], Want: brokerValue(m[2]), Have: brokerValue(m[3]), Err: err}
		}
	}
	return fmt.Errorf("declare %s %s: %w", kind, name, err)
}

// brokerValue shortens "the value 'true' of type 'bool'" to 'true'.
func brokerValue(s string) string {
	s = strings.TrimPrefix(s, "the value ")
	if i := strings.Index(s, "' of type '"); i >= 0 {
		s = s[:i+1]
	}
	return s
}
