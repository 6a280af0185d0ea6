package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// options are the command-line flags.
type options struct {
	messages      int     // orders pre-filled per configuration
	duplicateRate float64 // probability that an order is sent twice
	seed          uint64
	configs       []string

	peerWorkers  int // plain consumer workers, Watermill handlers, pgbench clients; their pool size
	peerPrefetch int // plain consumer's prefetch

	// Payment service with the gateway at 0 ms; 0 leaves the service's default.
	workers, prefetch, dbConns int
	// Payment service with the gateway at latency.
	latency                                     time.Duration
	latencyWorkers, latencyPrefetch, latencyDBs int
	// Group commit settings of the group-commit configurations; "" leaves the
	// service's default. The per-message configurations set GROUP_COMMIT_MAX=1.
	groupCommitMax, groupCommitWait string
	serviceEnv                      []string // more NAME=value for every payment-service run

	paced         time.Duration // length of the paced phase
	pacedFraction float64       // paced rate as a fraction of the drain rate
	pacedMaxRate  float64
	// pipelineBase is the drain rate the pipeline's paced phase is a
	// fraction of: basePayment or basePipeline.
	pipelineBase string

	relayRows   int           // rows in the outbox before the relay configuration's relay starts
	sustain     time.Duration // length of the sustained configuration's run
	sustainRate float64       // messages per second its backlog is sized for; 0: from its probe

	drainTimeout time.Duration
	binDir       string
	amqpURL      string
	adminURL     string
	rabbitmqctl  string
	workDir      string // logs and samples; "" is a fresh temporary directory
	markdownPath string
	keep         bool
}

// configNames are the configurations of all, in the order they run: the
// plain consumer before the others, which the table relates to it.
var configNames = []string{"pgbench", "amqp091", "watermill", "kit", "service", "service-gc", "service-latency", "service-gc-latency",
	"service-buffered", "service-buffered-latency", "pipeline", "relay"}

// longConfigs are not in all: each runs for minutes (-sustain).
var longConfigs = []string{"sustained"}

// The bases of the pipeline's paced rate (-pipeline-paced-base).
const (
	basePayment  = "payment"  // the payment service's drain rate in the pipeline
	basePipeline = "pipeline" // the pipeline's end-to-end drain rate: to the last shipment
)

const usage = `Usage: bench [flags]

Measures, on a fresh vhost and fresh databases per configuration, how fast each
consumer drains a pre-filled queue of OrderPlaced messages, and its publish→commit
latency in a paced phase after the drain. Prints one table. Run it from the
repository root after make build (make bench does both).

Configurations (-configs, comma-separated, or all):
  pgbench             the inbox + payment transaction in pgbench: the database's ceiling
  amqp091             a plain amqp091-go consumer, same transaction, no gateway
  watermill           Watermill's AMQP subscriber, same transaction, no gateway
  kit                 the kit alone (bench-kit): a service on the kit whose handler does the
                      peers' payment insert, no gateway, no outbox, group commit
  service             payment-service per message (GROUP_COMMIT_MAX=1), gateway at 0 ms
  service-gc          payment-service with group commit, gateway at 0 ms
  service-latency     payment-service per message, gateway at -latency
  service-gc-latency  payment-service with group commit, gateway at -latency
  service-buffered    payment-service with the buffered inbox (INBOX_MODE=buffered), gateway at 0 ms
  service-buffered-latency
                      payment-service with the buffered inbox, gateway at -latency
  pipeline            payment-service with group commit, gateway at 0 ms, emitting OrderPaid
                      through its outbox to shipping-service and the fake carrier: the
                      relay's rate and the payment commit→shipment latency
  relay               the outbox relay alone (bench-relay): -relay-rows OrderPaid rows
                      committed before the clock starts, published with confirms
                      into a quorum queue: events/s and CPU per event

Not in all (add them: -configs all,sustained):
  sustained           payment-service with group commit and its relay, gateway at 0 ms,
                      at its full rate (a pre-filled backlog) for -sustain: payments/s,
                      events sent/s, and the outbox's oldest pending age every second

Flags:
`

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var configs, serviceEnv string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	fs.IntVar(&o.messages, "messages", 20000, "orders pre-filled per configuration, each its own message id; duplicates come on top")
	fs.Float64Var(&o.duplicateRate, "duplicate-rate", 0.1, "probability (0..1) that an order is published twice with the same message id, back to back")
	fs.Uint64Var(&o.seed, "seed", 0, "seed for amounts, customers and duplicates (default: random)")
	fs.StringVar(&configs, "configs", "all", "configurations to run, comma-separated; all stands for every one but sustained")
	fs.IntVar(&o.peerWorkers, "peer-workers", 8, "workers of the plain consumer, handlers of Watermill, pgbench clients; also their pool size")
	fs.IntVar(&o.peerPrefetch, "peer-prefetch", 200, "prefetch of the plain consumer (Watermill keeps its default, 1 per subscription)")
	fs.IntVar(&o.workers, "workers", 0, "WORKERS of payment-service with the gateway at 0 ms (0: the service's default)")
	fs.IntVar(&o.prefetch, "prefetch", 0, "PREFETCH of payment-service with the gateway at 0 ms (0: the service's default)")
	fs.IntVar(&o.dbConns, "db-conns", 0, "DB_MAX_CONNS of payment-service with the gateway at 0 ms (0: the service's default)")
	fs.DurationVar(&o.latency, "latency", 100*time.Millisecond, "gateway latency (FAULT_LATENCY) of the -latency configurations")
	fs.IntVar(&o.latencyWorkers, "latency-workers", 256, "WORKERS of payment-service with the gateway at -latency")
	fs.IntVar(&o.latencyPrefetch, "latency-prefetch", 512, "PREFETCH of payment-service with the gateway at -latency")
	fs.IntVar(&o.latencyDBs, "latency-db-conns", 10, "DB_MAX_CONNS of payment-service with the gateway at -latency")
	fs.StringVar(&o.groupCommitMax, "group-commit-max", "", "GROUP_COMMIT_MAX of the group-commit configurations (default: the service's)")
	fs.StringVar(&o.groupCommitWait, "group-commit-wait", "", "GROUP_COMMIT_WAIT of the group-commit configurations (default: the service's)")
	fs.StringVar(&serviceEnv, "service-env", "", "more `NAME=value,...` for every payment-service run")
	fs.DurationVar(&o.paced, "paced", 10*time.Second, "length of the paced phase after each drain, where publish→commit is measured (0: none)")
	fs.Float64Var(&o.pacedFraction, "paced-fraction", 0.7, "paced rate as a fraction of the configuration's drain rate (0.7: the latency targets' pace)")
	fs.Float64Var(&o.pacedMaxRate, "paced-max-rate", 2000, "cap of the paced rate, messages per second")
	fs.StringVar(&o.pipelineBase, "pipeline-paced-base", basePayment, "the drain rate the pipeline's paced rate is a fraction of: "+
		basePayment+" (the payment service's: messages settled per second) or "+basePipeline+" (the pipeline's end to end: messages of the drain per second until its last shipment)")
	fs.IntVar(&o.relayRows, "relay-rows", 100000, "rows in the outbox before the relay configuration's relay starts")
	fs.DurationVar(&o.sustain, "sustain", 5*time.Minute, "length of the sustained configuration's run at full rate")
	fs.Float64Var(&o.sustainRate, "sustain-rate", 0, "messages per second the sustained configuration's backlog is sized for, with a margin of half as much again (0: the drain rate of its probe)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 5*time.Minute, "give a configuration up after a drain this long")
	fs.StringVar(&o.binDir, "bin", "bin", "directory of the built programs (make build, make bench)")
	fs.StringVar(&o.amqpURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "broker; each configuration gets its own vhost")
	fs.StringVar(&o.adminURL, "pg-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL admin URL; each configuration gets its own database")
	fs.StringVar(&o.rabbitmqctl, "rabbitmqctl", "rabbitmqctl", "command that runs rabbitmqctl (e.g. \"sudo rabbitmqctl\")")
	fs.StringVar(&o.workDir, "work-dir", "", "directory for logs and samples (default: a new temporary directory, kept if a configuration fails)")
	fs.StringVar(&o.markdownPath, "markdown", "", "also write the table as Markdown to this `path`")
	fs.BoolVar(&o.keep, "keep", false, "keep the vhosts and databases")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: every option is a flag", fs.Args())
	}
	if !isSet(fs, "seed") {
		o.seed = rand.Uint64()
	}
	for _, c := range strings.Split(configs, ",") {
		if c == "all" {
			o.configs = append(o.configs, configNames...)
		} else {
			o.configs = append(o.configs, c)
		}
	}
	if serviceEnv != "" {
		o.serviceEnv = strings.Split(serviceEnv, ",")
	}
	return o, o.validate()
}

func (o options) validate() error {
	for _, c := range o.configs {
		if !slices.Contains(configNames, c) && !slices.Contains(longConfigs, c) {
			return fmt.Errorf("invalid flag -configs: unknown configuration %q (want %s, %s or all)", c,
				strings.Join(configNames, ", "), strings.Join(longConfigs, ", "))
		}
	}
	for _, kv := range o.serviceEnv {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("invalid flag -service-env: %q is not NAME=value", kv)
		}
	}
	checks := []struct {
		ok        bool
		flag, msg string
	}{
		{o.messages >= 1, "messages", "must be at least 1"},
		{o.duplicateRate >= 0 && o.duplicateRate <= 1, "duplicate-rate", "must be between 0 and 1"},
		{o.peerWorkers >= 1, "peer-workers", "must be at least 1"},
		{o.peerPrefetch >= o.peerWorkers, "peer-prefetch", "must be at least -peer-workers"},
		{o.workers >= 0 && o.prefetch >= 0 && o.dbConns >= 0, "workers", "-workers, -prefetch and -db-conns must not be negative"},
		{o.latency > 0, "latency", "must be positive"},
		{o.latencyWorkers >= 1 && o.latencyPrefetch >= o.latencyWorkers, "latency-prefetch", "must be at least -latency-workers ≥ 1"},
		{o.latencyDBs >= 2, "latency-db-conns", "must be at least 2"},
		{o.paced >= 0, "paced", "must not be negative"},
		{o.pacedFraction > 0 && o.pacedFraction <= 1, "paced-fraction", "must be in (0, 1]"},
		{o.pacedMaxRate > 0, "paced-max-rate", "must be positive"},
		{o.drainTimeout > 0, "drain-timeout", "must be positive"},
		{o.pipelineBase == basePayment || o.pipelineBase == basePipeline, "pipeline-paced-base", "must be " + basePayment + " or " + basePipeline},
		{o.relayRows >= 1, "relay-rows", "must be at least 1"},
		{o.sustain >= time.Second, "sustain", "must be at least 1s"},
		{o.sustainRate >= 0, "sustain-rate", "must not be negative"},
	}
	for _, c := range checks {
		if !c.ok {
			return fmt.Errorf("invalid flag -%s: %s", c.flag, c.msg)
		}
	}
	return nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
