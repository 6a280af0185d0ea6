//go:build disruptive

package e2e_test

import (
	"testing"

	"github.com/inbox-template/payment-service/kit/kittest/faultkit"
)

// This file holds tests that disturb the whole broker, not just their vhost.
// They are built only with -tags disruptive and run on their own, after the
// main suite (see the Makefile's test target), so they never hit another test.

// The fault kit's broker scenarios against the payment service: the broker
// stopped and started again twice under load, and stopped for 20 s while
// the outbox holds a backlog (a memory alarm blocked the relay); then
// inboxctl verify and the outbox checks of paymentTrial.
func TestDisruptivePaymentUnderBrokerFaults(t *testing.T) {
	faultkit.Run(t, []faultkit.Scenario{faultkit.BrokerRestart, faultkit.BrokerStopOutboxBacklog(100)}, paymentTrial(nil))
}

// The broker restarts with the buffered inbox: its ingest reconnects, and
// its processing goes on from the table while the broker is away.
func TestDisruptivePaymentUnderBrokerFaultsBuffered(t *testing.T) {
	faultkit.Run(t, []faultkit.Scenario{faultkit.BrokerRestart}, paymentTrial(bufferedFaultEnv))
}
