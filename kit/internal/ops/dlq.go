package ops

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/inbox-template/payment-service/kit/internal/deadletter"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

func dlq(ctx context.Context, opts service.Options, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErrorf("dlq: missing subcommand (list, replay or purge)")
	}
	switch args[0] {
	case "list":
		return dlqList(ctx, opts, args[1:], stdout)
	case "replay":
		return dlqReplay(ctx, opts, args[1:], stdout)
	case "purge":
		return dlqPurge(opts, args[1:], stdin, stdout)
	}
	return usageErrorf("dlq: unknown subcommand %q (want list, replay or purge)", args[0])
}

// withQueue connects to the broker of the service's configuration and runs f
// on its dead-letter queue.
func withQueue(opts service.Options, f func(q *deadletter.Queue, limit ageLimit) error) error {
	cfg, err := service.LoadConfig(opts)
	if err != nil {
		return err
	}
	conn, err := rabbit.Dial(cfg.AMQPURL, cfg.Heartbeat, opts.Name+" ops")
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(deadletter.New(conn, service.Topology(cfg), opts.LogAttrs), newAgeLimit(cfg))
}

// ageLimit is the oldest a dead letter may be for a replay: the services it
// calls remember its idempotency keys for keyTTL, and the replay's own
// retries may take retries of that.
type ageLimit struct {
	max, keyTTL, retries time.Duration
	none                 bool // the service makes no outside calls
}

func newAgeLimit(cfg service.Config) ageLimit {
	return ageLimit{max: cfg.ReplayMaxAge(), keyTTL: cfg.IdempotencyKeyTTL, retries: cfg.LongestRetrySpan(), none: cfg.NoOutsideCalls()}
}

func (l ageLimit) String() string {
	if l.none {
		return "no limit (the service makes no outside calls)"
	}
	return fmt.Sprintf("%s (IDEMPOTENCY_KEY_TTL %s less %s that a replay's retries may take)", l.max, l.keyTTL, l.retries)
}

// ageText says how old m is and what its age counts from.
func ageText(m deadletter.Message, now time.Time) string {
	switch {
	case m.Published():
		return "first published " + age(m.Age(now)) + " ago"
	case m.AgeFrom != "":
		return "dead-lettered " + age(m.Age(now)) + " ago (no publish time on the message: neither " +
			deadletter.AgeFromPublishMillis + " nor a timestamp; it was first tried earlier still)"
	}
	return "of unknown age (no publish time, no dead-lettering time)"
}

func dlqList(ctx context.Context, opts service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dlq list", flag.ContinueOnError)
	limit := fs.Int("limit", 100, "show at most this many messages")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *limit < 1 {
		return fmt.Errorf("dlq list: --limit must be at least 1, got %d", *limit)
	}
	return withQueue(opts, func(q *deadletter.Queue, maxAge ageLimit) error {
		l, err := q.List(ctx, *limit)
		if err != nil {
			return fmt.Errorf("dlq list: %w", err)
		}
		if *asJSON {
			return printListingJSON(stdout, q.Name(), l, maxAge, time.Now())
		}
		return printListing(stdout, q.Name(), l, maxAge, time.Now())
	})
}

func printListing(w io.Writer, queue string, l deadletter.Listing, maxAge ageLimit, now time.Time) error {
	fmt.Fprintf(w, "%s: %d messages, showing %d\n", queue, l.Depth, len(l.Messages))
	if len(l.Messages) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE ID\tROUTING KEY\tATTRIBUTES\tREASON\tATTEMPTS\tREPLAYS\tAGE\tFIRST ERROR")
	var tooOld, undated bool
	for _, m := range l.Messages {
		cell := age(m.Age(now))
		if m.AgeFrom != "" && !m.Published() {
			cell += "*"
			undated = true
		}
		if !maxAge.none && m.OlderThan(maxAge.max, now) {
			cell += " too old"
			tooOld = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", orDash(m.ID), orDash(m.RoutingKey), orDash(m.AttrsText()), orDash(m.Reason),
			m.Attempts, m.Replays, cell, orDash(oneLine(m.FirstError, 80)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if undated {
		fmt.Fprintln(w, "*: no publish time on the message; its age counts from its dead-lettering, and it is older than that")
	}
	if tooOld {
		fmt.Fprintf(w, "too old: older than %s, or of unknown age: dlq replay refuses it without --force\n", maxAge)
	}
	return nil
}

func printListingJSON(w io.Writer, queue string, l deadletter.Listing, maxAge ageLimit, now time.Time) error {
	type message struct {
		deadletter.Message
		AgeSeconds int64 `json:"age_seconds"`
		TooOld     bool  `json:"too_old"` // dlq replay refuses it without --force
	}
	out := struct {
		Queue string `json:"queue"`
		Depth int    `json:"depth"`
		// null: no age limit (the service makes no outside calls)
		ReplayMaxAgeSecs *int64    `json:"replay_max_age_seconds"`
		Messages         []message `json:"messages"`
	}{Queue: queue, Depth: l.Depth, Messages: []message{}}
	if !maxAge.none {
		secs := int64(maxAge.max.Seconds())
		out.ReplayMaxAgeSecs = &secs
	}
	for _, m := range l.Messages {
		out.Messages = append(out.Messages, message{m, int64(m.Age(now).Seconds()), !maxAge.none && m.OlderThan(maxAge.max, now)})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func dlqReplay(ctx context.Context, svc service.Options, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dlq replay", flag.ContinueOnError)
	var sel deadletter.Selector
	fs.StringVar(&sel.ID, "id", "", "replay the message with this message id")
	fs.StringVar(&sel.Reason, "reason", "", "replay every message dead-lettered with this reason")
	fs.BoolVar(&sel.All, "all", false, "replay every message")
	opts := deadletter.ReplayOptions{}
	fs.BoolVar(&opts.DryRun, "dry-run", false, "show what would be replayed; change nothing")
	fs.IntVar(&opts.MaxReplays, "max-replays", deadletter.DefaultMaxReplays, "refuse a message replayed this often already")
	fs.BoolVar(&opts.Force, "force", false, "replay messages older than the idempotency keys live too (the side effects may repeat)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if sel.Validate() != nil {
		return usageErrorf("dlq replay: give exactly one of --id, --reason or --all")
	}
	if opts.MaxReplays < 1 {
		return fmt.Errorf("dlq replay: --max-replays must be at least 1, got %d", opts.MaxReplays)
	}
	return withQueue(svc, func(q *deadletter.Queue, maxAge ageLimit) error {
		opts.MaxAge, opts.NoAgeLimit = maxAge.max, maxAge.none
		rep, err := q.Replay(ctx, sel, opts)
		printReplay(stdout, rep, opts, maxAge, time.Now())
		if err != nil {
			return fmt.Errorf("dlq replay: %w", err)
		}
		// An id names one message: not finding it is an error a script
		// sees (a typo, or someone replayed it already), where a reason or
		// --all selecting nothing just leaves nothing to do.
		if sel.ID != "" && len(rep.Replayed)+len(rep.Refused)+len(rep.TooOld) == 0 {
			return fmt.Errorf("dlq replay: no message with id %q in %s (visited %d of %d ready; one another dlq list or replay holds is not ready)",
				sel.ID, q.Name(), rep.Visited, rep.Depth)
		}
		return nil
	})
}

func printReplay(w io.Writer, rep deadletter.ReplayReport, opts deadletter.ReplayOptions, maxAge ageLimit, now time.Time) {
	verb := "replayed"
	if opts.DryRun {
		verb = "would replay"
	}
	for _, m := range rep.Replayed {
		fmt.Fprintf(w, "%s %s (%s, reason %s) as replay %d of %d\n",
			verb, orDash(m.ID), orDash(m.AttrsText()), orDash(m.Reason), m.Replays, opts.MaxReplays)
	}
	for _, m := range rep.Forced {
		fmt.Fprintf(w, "forced %s (%s): %s, older than %s: the services it calls may have forgotten its idempotency keys "+
			"and repeat its side effects\n", orDash(m.ID), orDash(m.AttrsText()), ageText(m, now), maxAge)
	}
	for _, m := range rep.Refused {
		fmt.Fprintf(w, "refused %s (%s, reason %s): replayed %d times already (--max-replays %d); left in the dead-letter queue\n",
			orDash(m.ID), orDash(m.AttrsText()), orDash(m.Reason), m.Replays, opts.MaxReplays)
	}
	for _, m := range rep.TooOld {
		fmt.Fprintf(w, "refused %s (%s, reason %s): %s, older than %s: the services it calls may have forgotten its idempotency keys, "+
			"and a replay could repeat its side effects (a card charged twice, say); left in the dead-letter queue (--force replays it)\n",
			orDash(m.ID), orDash(m.AttrsText()), orDash(m.Reason), ageText(m, now), maxAge)
	}
	fmt.Fprintf(w, "%d %s, %d refused at the replay cap, %d refused as too old, %d not selected (visited %d of %d)\n",
		len(rep.Replayed), verb, len(rep.Refused), len(rep.TooOld), rep.Skipped, rep.Visited, rep.Depth)
	if opts.DryRun {
		fmt.Fprintln(w, "dry run: nothing changed")
	}
}

func dlqPurge(opts service.Options, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("dlq purge", flag.ContinueOnError)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return withQueue(opts, func(q *deadletter.Queue, _ ageLimit) error {
		if !*yes {
			if err := confirmPurge(q, stdin, stdout); err != nil {
				return err
			}
		}
		n, err := q.Purge()
		if err != nil {
			return fmt.Errorf("dlq purge: %w", err)
		}
		_, err = fmt.Fprintf(stdout, "purged %d messages from %s\n", n, q.Name())
		return err
	})
}

// confirmPurge asks for the queue's name: a purge cannot be undone, and
// typing the name proves the operator knows which vhost and queue it hits.
func confirmPurge(q *deadletter.Queue, stdin io.Reader, stdout io.Writer) error {
	n, err := q.Depth()
	if err != nil {
		return fmt.Errorf("dlq purge: %w", err)
	}
	fmt.Fprintf(stdout, "%s holds %d messages; a purge deletes them for good.\nType the queue name to confirm: ", q.Name(), n)
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("dlq purge: read confirmation: %w", err)
	}
	if strings.TrimSpace(line) != q.Name() {
		return errors.New("dlq purge: confirmation did not match the queue name; nothing purged")
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine fits an error message into one table cell.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// age prints a duration the way an operator reads it: 42s, 12m, 5h3m, 3d4h.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}
