package e2e_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The fault scripts sum a metric over its samples whose labels include the
// ones they name: database-restart.sh asks for the payment service's pauses
// of every cause. (It matched the whole series text, so a metric with more
// labels than named, consumer_pauses_total{cause,consumer}, summed to 0.)
func TestFaultScriptsSumAMetricOverItsLabels(t *testing.T) {
	page := `# HELP consumer_pauses_total Pauses.
consumer_pauses_total{cause="database",consumer="payment-service"} 3
consumer_pauses_total{cause="handler_failing",consumer="payment-service"} 2
consumer_pauses_total{cause="database",consumer="shipping-service"} 7
consumer_pauses_totals{consumer="payment-service"} 9
consumer_messages_total{consumer="payment-service",outcome="retried"} 4
consumer_messages_total{consumer="payment-service",outcome="duplicate"} 1e+01
`
	for series, want := range map[string]string{
		`consumer_pauses_total{consumer="payment-service"}`:                     "5",
		`consumer_pauses_total`:                                                 "12",
		`consumer_messages_total{consumer="payment-service",outcome="retried"}`: "4",
		`consumer_messages_total{outcome="duplicate"}`:                          "10",
		`consumer_reconnects_total{consumer="payment-service"}`:                 "0",
	} {
		cmd := exec.Command("bash", "-c", `source ../../scripts/lib.sh && series_sum "$1"`, "bash", series)
		cmd.Stdin = strings.NewReader(page)
		out, err := cmd.CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != want {
			t.Errorf("series_sum %s = %q (%v), want %s", series, got, err, want)
		}
	}
}
