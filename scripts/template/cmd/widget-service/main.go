// Command widget-service runs the widget service (internal/widget) on the kit: the
// consumer, and its operations commands (dlq, inbox; widget-service help).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/inbox-template/payment-service/kit"
	app "github.com/inbox-template/payment-service/scripts/template/internal/widget"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := kit.Run(ctx, app.Service(), os.Args[1:], os.Stdin, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "widget-service:", err)
		os.Exit(1)
	}
}
