package fakegateway

import "github.com/prometheus/client_golang/prometheus"

// Results of POST /v1/charges, the label values of gateway_requests_total.
const (
	resultCreated       = "created"
	resultReplayed      = "replayed"
	resultInFlight      = "in_flight"
	resultMismatch      = "mismatch"
	resultBadRequest    = "bad_request"
	resultInjectedError = "injected_error"
	resultLostResponse  = "lost_response"
	resultAbandoned     = "abandoned" // the client left before the charge ran; the key was released
	resultInternalError = "internal_error"
)

// metrics are the Server's Prometheus collectors.
type metrics struct {
	requests  *prometheus.CounterVec
	charges   *prometheus.CounterVec
	takeovers prometheus.Counter
	forgotten prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_requests_total",
			Help: "Charge requests by result (created, replayed, in_flight, mismatch, bad_request, injected_error, lost_response, abandoned, internal_error).",
		}, []string{"result"}),
		charges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_charges_total",
			Help: "Charges executed, by status (succeeded, declined). Replays are not counted.",
		}, []string{"status"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_in_flight_takeovers_total",
			Help: "In-flight keys presumed abandoned and executed by a later request.",
		}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_keys_forgotten_total",
			Help: "Completed keys older than the key lifetime (KEY_TTL) forgotten when a request used them again: each such request charged again.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.charges, m.takeovers, m.forgotten} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Export zeros, so that rate() and alerts see every series from the start.
	for _, r := range []string{resultCreated, resultReplayed, resultInFlight, resultMismatch, resultBadRequest,
		resultInjectedError, resultLostResponse, resultAbandoned, resultInternalError} {
		m.requests.WithLabelValues(r)
	}
	m.charges.WithLabelValues(statusSucceeded)
	m.charges.WithLabelValues(statusDeclined)
	return m, nil
}
