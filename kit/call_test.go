package kit_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/kittest"
)

// A service that declares no outside calls has no key-expiry guard: one
// whose handler declares an outside call anyway does not start, and says
// why, rather than running its retries unguarded.
func TestOutsideCallIsRefusedWhereTheServiceDeclaresNone(t *testing.T) {
	svc := kit.Consume(kit.Service{Name: "invoice-service", Event: "invoice-due", Exchange: "billing", RoutingKey: "invoice.due", NoOutsideCalls: true},
		kit.Events[InvoiceDue]{Decode: DecodeInvoiceDue, ID: func(e InvoiceDue) string { return e.EventID }},
		func(d *kit.Deps) (kit.Handler[InvoiceDue], error) {
			return &Invoices{post: kit.OutsideCall(d, "ledger post", "after-ledger-post", Ledger{}.Post)}, nil
		})
	t.Setenv("AMQP_URL", kittest.VHost(t))
	t.Setenv("DATABASE_URL", kittest.Postgres(t))
	t.Setenv("HTTP_ADDR", testenv.FreeAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := kit.Run(ctx, svc, nil, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `kit.OutsideCall("ledger post"): the service declares NoOutsideCalls`) {
		t.Errorf("a service declaring NoOutsideCalls with an outside call: %v, want a refusal at start naming the call", err)
	}
}

// A migration directory that is not there is refused as the program starts.
func TestMigrationsRefuseAMissingDirectory(t *testing.T) {
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), `no directory migrationz`) {
			t.Errorf("kit.Migrations with a missing directory: %v, want a panic naming it", p)
		}
	}()
	kit.Migrations("invoice-service", migrationFiles, "migrationz")
}
