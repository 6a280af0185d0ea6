// Command shipping-service is the example consumer: it books a carrier pickup
// for each OrderPaid event, exactly once. See examples/shipping.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/inbox-template/payment-service/examples/shipping"
	"github.com/inbox-template/payment-service/kit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := kit.Run(ctx, shipping.Service(), os.Args[1:], os.Stdin, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shipping-service:", err)
		os.Exit(1)
	}
}
