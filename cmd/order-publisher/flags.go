package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/inbox-template/payment-service/internal/demo/producer"
)

// options are the command-line flags; the broker comes from the environment.
type options struct {
	load        producer.Load
	rate        float64
	summaryPath string
	timeout     time.Duration
	oncePath    string // skip when it exists; created after a complete run
}

const usage = `Usage: order-publisher [flags]

Publishes OrderPlaced events to EXCHANGE with ROUTING_KEY on AMQP_URL (environment),
with publisher confirms. Exits 1 unless every message was confirmed and none returned.

Flags:
`

// usageError is a command line the publisher does not take: main prints it
// once, with where the usage is, rather than the flag package's whole usage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() + "\nrun 'order-publisher -h' for usage" }
func (e usageError) Unwrap() error { return e.err }

// parseFlags reads the flags; -h prints the usage to stderr and returns
// flag.ErrHelp, and any other mistake is a usageError.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	o, err := readFlags(args, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return o, usageError{err}
	}
	return o, err
}

func readFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("order-publisher", flag.ContinueOnError)
	// The flag package prints the usage on every mistake: only -h does here,
	// and the error alone says what is wrong (main prints it).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&o.load.Count, "count", 100, "distinct orders to publish")
	fs.StringVar(&o.load.RunID, "run-id", "", "`id` of this run; order ids are <run-id>-<n> (default: random)")
	fs.Uint64Var(&o.load.Seed, "seed", 0, "seed for amounts, currencies, customers, duplicates and republishes (default: random, printed in the summary)")
	fs.Float64Var(&o.load.DuplicateRate, "duplicate-rate", 0, "probability (0..1) of publishing an order again with the same message id and body")
	fs.Float64Var(&o.load.RepublishRate, "republish-rate", 0, "probability (0..1) of publishing an order again under a new message id / event_id")
	fs.IntVar(&o.load.Poison, "poison", 0, "poison messages, interleaved evenly, cycling through: "+poisonKinds())
	fs.BoolVar(&o.load.NoMessageID, "no-message-id", false, "publish valid orders without the message_id property (id only in the body's event_id)")
	fs.Float64Var(&o.rate, "rate", 0, "messages per second (0: unlimited)")
	fs.StringVar(&o.summaryPath, "summary", "", "also write the summary as JSON to this `path`")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	fs.StringVar(&o.oncePath, "once", "", "publish only if this `file` does not exist, and create it after a run that published everything (a demo load once per fresh volume)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usage)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every option is a flag", fs.Args())
	}
	if o.load.RunID == "" {
		o.load.RunID = producer.NewRunID()
	}
	if !isSet(fs, "seed") {
		o.load.Seed = uint64(rand.Uint32()) // small enough to survive a JSON float
	}
	return o, o.validate()
}

func (o options) validate() error {
	checks := []struct {
		ok   bool
		flag string
		msg  string
	}{
		{o.load.Count >= 0, "count", fmt.Sprintf("must not be negative, got %d", o.load.Count)},
		{o.load.Poison >= 0, "poison", fmt.Sprintf("must not be negative, got %d", o.load.Poison)},
		{o.load.DuplicateRate >= 0 && o.load.DuplicateRate <= 1, "duplicate-rate", fmt.Sprintf("must be between 0 and 1, got %v", o.load.DuplicateRate)},
		{o.load.RepublishRate >= 0 && o.load.RepublishRate <= 1, "republish-rate", fmt.Sprintf("must be between 0 and 1, got %v", o.load.RepublishRate)},
		{o.rate >= 0, "rate", fmt.Sprintf("must not be negative, got %v", o.rate)},
		{o.timeout > 0, "timeout", fmt.Sprintf("must be positive, got %s", o.timeout)},
	}
	for _, c := range checks {
		if !c.ok {
			return fmt.Errorf("invalid flag -%s: %s", c.flag, c.msg)
		}
	}
	if err := o.load.Validate(); err != nil {
		return fmt.Errorf("invalid flags: %w", err)
	}
	return nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func poisonKinds() string {
	var names []string
	for _, k := range producer.PoisonKinds() {
		names = append(names, string(k))
	}
	return strings.Join(names, ", ")
}
