// Package kit is the inbox kit: the runtime every RabbitMQ consumer on it
// keeps (kit/consumer, kit/service, kit/outbox, kit/ops and the rest). It is
// a Go module of its own, released on its own: a service requires it at a
// version and takes an upgrade with
//
//	go get github.com/inbox-template/payment-service/kit@v0.2.0
//
// (the template's docs/upgrading.md: the releases, a file-based module
// proxy for a kit that is not published, vendoring).
package kit

// Version is this kit's release, as its tag names it (kit/v0.1.0 in the
// template's repository): what scripts/new-project.sh --bare requires and
// scripts/kitproxy serves by default. A release changes it with the tag; a
// service's `version` command prints it beside the module version it was
// built from.
const Version = "v0.1.0"
