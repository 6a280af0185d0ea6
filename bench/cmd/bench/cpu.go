package main

import (
	"fmt"
	"time"

	"github.com/inbox-template/payment-service/bench/internal/proc"
)

// cpuSample is the CPU time used so far by each side of a configuration.
type cpuSample struct {
	consumer time.Duration // the program under test
	helpers  time.Duration // what it calls or feeds: the fake gateway, the pipeline's second half
	postgres time.Duration // every PostgreSQL process: backends, WAL writer, checkpointer
	rabbitmq time.Duration // the broker's Erlang VM
	machine  time.Duration // every CPU's busy time, the bench's own included
}

// helped is a configuration with processes of its own beside the consumer.
type helped interface {
	helpers() []*proc.Process
}

// sampleCPU reads the CPU times now; consumer is nil before it starts.
func sampleCPU(consumer *proc.Process, c consumer) (cpuSample, error) {
	var s cpuSample
	var err error
	if consumer != nil {
		if s.consumer, err = consumer.CPU(); err != nil {
			return s, fmt.Errorf("CPU of %s: %w", consumer.Name, err)
		}
	}
	if h, ok := c.(helped); ok {
		for _, p := range h.helpers() {
			if p == nil {
				continue
			}
			t, err := p.CPU()
			if err != nil {
				return s, fmt.Errorf("CPU of %s: %w", p.Name, err)
			}
			s.helpers += t
		}
	}
	if s.postgres, err = proc.CommandCPU("postgres"); err != nil {
		return s, err
	}
	if s.rabbitmq, err = proc.CommandCPU("beam.smp"); err != nil {
		return s, err
	}
	s.machine, err = proc.MachineCPU()
	return s, err
}

// cpuPerMessage is CPU time per message over a window, in microseconds.
type cpuPerMessage struct {
	consumer, helpers, postgres, rabbitmq, machine float64
	measured                                       bool
}

func perMessage(before, after cpuSample, messages int) cpuPerMessage {
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(messages) }
	return cpuPerMessage{
		consumer: us(after.consumer - before.consumer), helpers: us(after.helpers - before.helpers),
		postgres: us(after.postgres - before.postgres), rabbitmq: us(after.rabbitmq - before.rabbitmq),
		machine: us(after.machine - before.machine), measured: true,
	}
}
