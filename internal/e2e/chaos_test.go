//go:build chaos

package e2e_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/kittest/faultkit"
)

// The chaos run: every fault at once against two replicas of the payment
// service, built only with -tags chaos (make chaos, scripts/chaos.sh):
// the crash points armed at small probabilities (the outbox relay's too),
// random SIGKILLs, the broker closing every connection, the database's
// sessions terminated and the fake gateway answering 503 and losing
// responses, while CHAOS_ORDERS orders (default 1500, with duplicates,
// republishes and 20 poison messages) are published over about 70% of
// CHAOS_DURATION (default 60s). Then inboxctl verify checks every
// invariant. CHAOS_CRASH_PROBABILITY sets the crash points' probability a
// message (default 0.002).
func TestPaymentChaos(t *testing.T) {
	paymentChaos(t, nil, "after-inbox-insert", "after-gateway-charge", "after-commit", "after-ack")
}

// The same with the buffered inbox, its two processing points armed too.
func TestPaymentChaosBuffered(t *testing.T) {
	paymentChaos(t, bufferedFaultEnv, "after-inbox-insert", "after-gateway-charge", "after-commit", "after-ack",
		"after-claim", "after-process-commit")
}

func paymentChaos(t *testing.T, env []string, points ...string) {
	d := chaosSetting(t, "CHAOS_DURATION", 60*time.Second, time.ParseDuration)
	orders := chaosSetting(t, "CHAOS_ORDERS", 1500, strconv.Atoi)
	p := chaosSetting(t, "CHAOS_CRASH_PROBABILITY", 0.002, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	var arms []faultkit.Arm
	for _, pt := range points {
		arms = append(arms, faultkit.Arm{Point: pt, P: p})
	}
	// The relay's point is hit once a batch, not once a message.
	arms = append(arms, faultkit.Arm{Point: "after-outbox-publish", P: p * 10})
	rate := float64(orders) / (d.Seconds() * 0.7)
	load := []string{"-count", strconv.Itoa(orders), "-duplicate-rate", "0.1", "-republish-rate", "0.05", "-poison", "20",
		"-rate", strconv.FormatFloat(rate, 'f', 1, 64), "-timeout", (d + 90*time.Second).String()}
	faultkit.Run(t, []faultkit.Scenario{faultkit.Chaos(d, arms, gatewayChaos)}, paymentTrial(env, load))
}

// gatewayChaos sets the fake gateway's 503 and lost-response rates at random.
var gatewayChaos = faultkit.Action{
	Name: "gateway fault rates changed",
	// Never both rates 0: each change injects a fault.
	Do: func(s *faultkit.Stack) bool {
		rates := [][2]float64{{0.05, 0}, {0.2, 0}, {0, 0.05}, {0, 0.15}, {0.05, 0.05}, {0.2, 0.15}}[rand.IntN(6)]
		e, l := rates[0], rates[1]
		gatewayFaults(s.T(), s.Getenv("GATEWAY_URL"), fmt.Sprintf(`{"error_rate":%g,"lost_response_rate":%g}`, e, l))
		s.T().Logf("chaos: fake gateway error_rate %g, lost_response_rate %g", e, l)
		return true
	},
	Reset: func(s *faultkit.Stack) {
		gatewayFaults(s.T(), s.Getenv("GATEWAY_URL"), `{"error_rate":0,"lost_response_rate":0,"latency":"0s"}`)
	},
}

func chaosSetting[V any](t *testing.T, name string, def V, parse func(string) (V, error)) V {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := parse(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}
