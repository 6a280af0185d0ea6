// Package kit is the inbox kit's API for a service's author: what a
// RabbitMQ consumer on the kit is written with, in one package. A service is
// a handler typed to its event, a description of the service and its main:
//
//	var ReasonMalformed = kit.NewReason("malformed_json")
//
//	type Handler struct{}
//
//	func (h *Handler) Handle(ctx context.Context, msg kit.Message, ev RefundRequested) (kit.Writes, error) {
//		return func(ctx context.Context, tx *gorm.DB) (kit.Outcome, error) {
//			// the service's writes, in the inbox transaction
//			return kit.OutcomeProcessed, nil
//		}, nil
//	}
//
//	func Service() kit.Service {
//		return kit.Consume(kit.Service{Name: "refund-service", Event: "refund-requested", …},
//			kit.Events[RefundRequested]{Decode: DecodeRefundRequested, …},
//			func(d *kit.Deps) (kit.Handler[RefundRequested], error) { return &Handler{}, nil })
//	}
//
//	func main() { … kit.Run(ctx, refund.Service(), os.Args[1:], os.Stdin, os.Stdout) … }
//
// The kit does the rest: configuration, the database and migrations, the
// consumer runtime (inline or buffered inbox), retries and dead letters, the
// outbox and its relay, metrics, health, traces and the shutdown order. That
// machinery is under internal/, out of a service's reach: a service imports
// this package, and kittest (with kittest/faultkit) for its tests.
//
// Most of this package's types are aliases of the machinery's, so that a
// value passes through the runtime as it is. go doc shows their fields and
// methods where they are defined (run it inside the kit's module):
//
//	go doc ./internal/service Options   # kit.Service (and Kit: kit.Deps, Config, Checks)
//	go doc ./internal/consumer Events   # kit.Events (and Message, Writes, Outcome, Reason, Cause)
//	go doc ./internal/outbox Outbox     # kit.Outbox (and Message: kit.OutboxMessage)
//	go doc ./internal/testenv Process   # kittest.Process (and Program, Cluster)
//	go doc ./internal/servicetest Stack # kittest.Stack (and Events)
//
// The kit is a Go module of its own, released on its own: a service requires
// it at a version and takes an upgrade with
//
//	go get github.com/inbox-template/payment-service/kit@vX.Y.Z
//
// (the template's docs/upgrading.md: the releases, a file-based module
// proxy for a kit that is not published, vendoring).
package kit

import "github.com/inbox-template/payment-service/kit/internal/release"

// Version is this kit's release, as its tag names it (kit/vX.Y.Z): a
// service's `version` command prints it beside the module version the
// binary was built from.
const Version = release.Version
