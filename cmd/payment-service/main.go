// Command payment-service consumes OrderPlaced events and charges each order
// exactly once: transactional inbox, idempotent gateway charge, ack after commit,
// poison messages to the dead-letter exchange. The service is internal/payment;
// the rest is the kit's: kit.Run runs the service, or one of its operations
// commands.
//
//	payment-service              consume until SIGINT or SIGTERM
//	payment-service healthcheck  exit 0 if the local service is ready
//	payment-service dlq list     and the other operations commands: payment-service help
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/kit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := kit.Run(ctx, payment.Service(), os.Args[1:], os.Stdin, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "payment-service:", err)
		os.Exit(1)
	}
}
