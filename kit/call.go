package kit

import (
	"context"
	"fmt"

	"github.com/inbox-template/payment-service/kit/faults"
	"github.com/inbox-template/payment-service/kit/internal/service"
	"github.com/inbox-template/payment-service/kit/tracing"
)

// OutsideCall declares a handler's call to a service outside its database (a
// payment gateway, a carrier) and returns it wrapped: traced as a span named
// span under the message's, and with the crash point crashAfter right after
// it returns (armed only with FAULTS_ENABLED, for the fault scripts). The
// call must be idempotent, with a key derived from the business entity: the
// kit keeps its retries within IDEMPOTENCY_KEY_TTL. A service that declares
// NoOutsideCalls has no such guard: OutsideCall, called in the handler's
// constructor, then refuses to start it.
func OutsideCall[Req, Resp any](d *Deps, span string, crashAfter CrashPoint, call func(context.Context, Req) (Resp, error)) func(context.Context, Req) (Resp, error) {
	if d.Config.NoOutsideCalls() {
		service.RefuseStart(fmt.Errorf("kit.OutsideCall(%q): the service declares NoOutsideCalls, so nothing keeps its retries within the callee's memory of an idempotency key; set NoOutsideCalls to false", span))
	}
	return faults.After(d.Crasher, crashAfter, tracing.Call(d.Tracer, span, call))
}

// CrashPoint names a place the process can be made to die at, for the
// fault scripts (POST /faults/crash with FAULTS_ENABLED=true): the kit's
// own (after-commit, …) and each service's after its outside calls
// (after-gateway-charge).
type CrashPoint = faults.Point
