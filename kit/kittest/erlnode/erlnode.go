// Package erlnode evaluates Erlang expressions on the local RabbitMQ node
// through erl_call (Erlang's own client, a C program: about 15 ms of CPU a
// call), for the tests and the tools beside them. A rabbitmqctl call boots
// an Erlang VM instead, about 1 s of CPU on 2 cores: the tests' vhost
// batches and the bench's vhosts went through it until December 2026, some
// 170 calls a CI run.
package erlnode

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrNotReached is Result's error when erl_call did not get an answer
// from the node (it is down, went down during the call, or the call timed
// out): the expression may or may not have run. An expression that ran
// and failed is another error.
var ErrNotReached = errors.New("no answer from the node")

// Node is a RabbitMQ node that erl_call reaches.
type Node struct {
	name string
	home string // a HOME holding the node's cookie (.erlang.cookie)
}

// Of is the node of the broker at amqpURL if erl_call can reach it:
// erl_call is on PATH, the cookie is readable (in HOME, or the rabbitmq
// user's, as for root), and the node has an AMQP listener on the URL's
// port, on this machine. The node is RABBITMQ_NODENAME, else NODENAME of
// /etc/rabbitmq/rabbitmq-env.conf, else rabbit@ the short host name, as
// rabbitmqctl finds it. ok is false otherwise: use rabbitmqctl.
func Of(amqpURL string) (n Node, ok bool) {
	if _, err := exec.LookPath("erl_call"); err != nil {
		return Node{}, false
	}
	u, err := url.Parse(amqpURL)
	if err != nil || !slices.Contains([]string{"127.0.0.1", "localhost", "::1"}, u.Hostname()) {
		return Node{}, false
	}
	port := u.Port()
	if port == "" {
		port = "5672"
	}
	n.name, n.home = name(), cookieHome()
	if n.name == "" || n.home == "" {
		return Node{}, false
	}
	ports, err := n.Result(`[element(6, L) || L <- rabbit_networking:node_listeners(node()), element(3, L) =:= amqp].`)
	if err != nil || !slices.Contains(strings.FieldsFunc(ports, func(r rune) bool { return r < '0' || r > '9' }), port) {
		return Node{}, false
	}
	return n, true
}

// At is node name (cluster1@localhost, say) of this machine if erl_call
// reaches it: erl_call is on PATH, the cookie is readable (as for Of), and
// the node answers. ok is false otherwise.
func At(name string) (n Node, ok bool) {
	if _, err := exec.LookPath("erl_call"); err != nil {
		return Node{}, false
	}
	n.name, n.home = name, cookieHome()
	if n.home == "" {
		return Node{}, false
	}
	if out, err := n.Result("node()."); err != nil || out != name {
		return Node{}, false
	}
	return n, true
}

// cookieHome is a HOME that holds a readable Erlang cookie: the user's,
// else the rabbitmq user's; "" if neither.
func cookieHome() string {
	for _, home := range []string{os.Getenv("HOME"), "/var/lib/rabbitmq"} {
		if f, err := os.Open(filepath.Join(home, ".erlang.cookie")); err == nil {
			_ = f.Close()
			return home
		}
	}
	return ""
}

// Name is the node's name, rabbit@localhost say.
func (n Node) Name() string { return n.name }

// name is the broker's node as rabbitmqctl would find it.
func name() string {
	if n := os.Getenv("RABBITMQ_NODENAME"); n != "" {
		return n
	}
	if b, err := os.ReadFile("/etc/rabbitmq/rabbitmq-env.conf"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "NODENAME="); ok {
				return strings.Trim(v, `"'`)
			}
		}
	}
	host, err := os.Hostname()
	if err != nil {
		return ""
	}
	short, _, _ := strings.Cut(host, ".")
	return "rabbit@" + short
}

// Result evaluates expr (one or more expressions, separated by commas and
// ended by a dot) on the node and returns its value as erl_call prints it
// (atoms, integers, lists and tuples as Erlang does; a binary as
// #Bin<97,98>); an expression that failed (a badmatch, say) is an error.
func (n Node) Result(expr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The cookie comes from HOME: on the command line (-c) it would show in
	// ps to every user of the machine. -R: a name the node gives this call.
	// Without it every erl_call is c17@host, and calls at once (test
	// binaries side by side) refused each other: 7 of 20 in a review.
	cmd := exec.CommandContext(ctx, "erl_call", "-R", "-n", n.name, "-timeout", "110", "-e") // #nosec G204 -- the node's name, as rabbitmqctl finds it
	cmd.Env = append(os.Environ(), "HOME="+n.home)
	cmd.Stdin = strings.NewReader(expr + "\n") // a form ends with a dot and a newline
	b, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(b))
	if err != nil {
		return "", fmt.Errorf("erl_call -n %s: %w (%v): %s", n.name, ErrNotReached, err, out)
	}
	// {ok, Value}, or {error, Why} with exit status 0 all the same.
	v, found := strings.CutPrefix(out, "{ok, ")
	if !found || !strings.HasSuffix(v, "}") {
		return "", fmt.Errorf("erl_call -n %s: %s", n.name, out)
	}
	return strings.TrimSuffix(v, "}"), nil
}

// Text evaluates body (expressions separated by commas, without the final
// dot) on the node; its value must be chardata (a string, a binary, an
// iolist of them, as io_lib:format or rabbit_json:encode return) and Text
// returns it exactly. erl_call prints a binary cut short after some bytes
// and a string without escaping its quotes, so the value travels as base64.
func (n Node) Text(body string) (string, error) {
	out, err := n.Result("binary_to_list(base64:encode(unicode:characters_to_binary(begin " + body + " end))).")
	if err != nil || out == "[]" { // the empty string: an empty list
		return "", err
	}
	b, err := base64.StdEncoding.DecodeString(chars(out))
	if err != nil {
		return "", fmt.Errorf("erl_call -n %s: not base64: %s", n.name, out)
	}
	return string(b), nil
}

// chars is the text of a string as erl_call prints it: "…", or, past
// 65,535 characters (where the distribution no longer sends a list of
// bytes as a string), a list of integers [65,66,…].
func chars(out string) string {
	inner, ok := strings.CutPrefix(out, "[")
	if !ok {
		return strings.Trim(out, `"`)
	}
	var b strings.Builder
	for f := range strings.SplitSeq(strings.TrimSuffix(inner, "]"), ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 0 || c > 255 {
			return out // not base64: the caller says so
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// Eval evaluates expr (ended by a dot) on the node and returns its value
// as rabbitmqctl eval prints it (io_lib's ~p).
func (n Node) Eval(expr string) (string, error) {
	body := strings.TrimSuffix(strings.TrimSpace(expr), ".")
	return n.Text(`io_lib:format("~p", [begin ` + body + ` end])`)
}

// Queues is the JSON of the queues of vhost, as rabbitmqctl list_queues
// --formatter json prints it for the columns name, messages,
// messages_ready, messages_unacknowledged, consumers and leader: an array
// of objects. Each queue's columns are read on its own node (a quorum
// queue's leader, as the queue's record names it), as list_queues reads
// them: only that node keeps the queue's counts. A queue whose counts are
// not known is listed by its name alone (with its leader, "", if that is
// known): its node does not answer within 10 s (a leader just killed), or
// it is a quorum queue whose leader is not running (an election under way).
func (n Node) Queues(vhost string) (string, error) {
	return n.Text(`Keys = [messages, messages_ready, messages_unacknowledged, consumers, leader],
	rabbit_json:encode([begin
		{resource, _, queue, N} = amqqueue:get_name(Q),
		Info = case catch rpc:call(amqqueue:qnode(Q), rabbit_amqqueue, info, [Q, Keys], 10000) of
			L when is_list(L) -> L;
			_ -> []
		end,
		Known = case {amqqueue:get_type(Q), lists:keyfind(leader, 1, Info)} of
			{rabbit_quorum_queue, {leader, ''}} -> [{leader, ''}];
			_ -> Info
		end,
		maps:from_list([{name, N} | [{K, V} || {K, V0} <- Known, lists:member(K, Keys),
			V <- [case V0 of A when is_atom(A) -> atom_to_binary(A); X when is_integer(X) -> X; _ -> none end], V =/= none]])
	end || Q <- rabbit_amqqueue:list(` + Binary(vhost) + `)])`)
}

// CloseConnections makes the node close every client connection of vhost,
// giving reason, as rabbitmqctl close_all_connections -p vhost does. Not
// idempotent: a caller that got an error must not do it again blindly (the
// node may have closed them before the error).
func (n Node) CloseConnections(vhost, reason string) error {
	_, err := n.Result(`rabbit_connection_tracking_handler:close_connections(rabbit_connection_tracking:list(` +
		Binary(vhost) + `), ` + Binary(reason) + `, 0), ok.`)
	return err
}

// Binary is s as an Erlang binary literal: <<"name">> for a plain name,
// the bytes one by one otherwise.
func Binary(s string) string {
	plain := true
	for _, r := range s {
		if r > '~' || r < ' ' || r == '"' || r == '\\' {
			plain = false
			break
		}
	}
	if plain {
		return `<<"` + s + `">>`
	}
	b := make([]string, len(s))
	for i := range len(s) {
		b[i] = fmt.Sprint(s[i])
	}
	return "<<" + strings.Join(b, ",") + ">>"
}
