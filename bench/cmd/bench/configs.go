package main

import (
	"context"
	"fmt"
)

// runConfig measures one configuration by name.
func (b *bench) runConfig(ctx context.Context, name string) result {
	var c consumer
	switch name {
	case "pgbench":
		return b.runPgbench(ctx)
	case "amqp091":
		c = b.newPlain()
	case "watermill":
		c = b.newWatermill()
	case "kit":
		c = b.newService(true, false).kit()
	case "service":
		c = b.newService(false, false)
	case "service-gc":
		c = b.newService(true, false)
	case "service-latency":
		c = b.newService(false, true)
	case "service-gc-latency":
		c = b.newService(true, true)
	case "service-buffered":
		c = b.newService(true, false).buffered()
	case "service-buffered-latency":
		c = b.newService(true, true).buffered()
	case "pipeline":
		c = b.newPipeline()
	case "relay":
		return b.runRelay(ctx)
	case "sustained":
		return b.runSustained(ctx)
	default:
		return result{name: name, err: fmt.Errorf("unknown configuration %q", name)}
	}
	return b.runConsumer(ctx, name, c)
}
