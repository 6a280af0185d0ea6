package outbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the outbox relay's, labelled by producer.
type Metrics struct {
	pending        *prometheus.GaugeVec
	oldest         *prometheus.GaugeVec
	parked         *prometheus.GaugeVec
	published      *prometheus.CounterVec
	failures       *prometheus.CounterVec
	reconnects     *prometheus.CounterVec
	failovers      *prometheus.CounterVec
	publishSeconds *prometheus.HistogramVec
}

// NewMetrics registers the outbox metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	producer := []string{"producer"}
	m := &Metrics{
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_pending",
			Help: "Outbox rows committed and not yet confirmed by the broker (read every 5s)."}, producer),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_oldest_pending_seconds",
			Help: "Age of the oldest pending outbox row; 0 when none (read every 5s)."}, producer),
		parked: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_parked",
			Help: "Outbox rows parked after their publishes failed, waiting for outbox retry (read every 5s)."}, producer),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_published_total",
			Help: "Outbox rows confirmed by the broker and marked sent."}, producer),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_publish_failures_total",
			Help: "Failed publishes of outbox rows, by reason (unroutable, refused)."}, []string{"producer", "reason"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_reconnects_total",
			Help: "Broker sessions of the outbox relay that ended and were opened again."}, producer),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_broker_failovers_total",
			Help: "Broker sessions of the outbox relay opened on another node of AMQP_URL than the session before."}, producer),
		publishSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outbox_publish_duration_seconds",
			Help:    "Time from a batch's first publish to its last confirm.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, producer),
	}
	reg.MustRegister(m.pending, m.oldest, m.parked, m.published, m.failures, m.reconnects, m.failovers, m.publishSeconds)
	return m
}

func (m *Metrics) set(producer string, st Status) {
	m.pending.WithLabelValues(producer).Set(float64(st.Pending))
	m.parked.WithLabelValues(producer).Set(float64(st.Parked))
	age := 0.0
	if !st.OldestPending.IsZero() {
		age = time.Since(st.OldestPending).Seconds()
	}
	m.oldest.WithLabelValues(producer).Set(age)
}

// Published is how many rows of producer were confirmed and marked sent.
func (m *Metrics) Published(producer string) int {
	return int(counter(m.published.WithLabelValues(producer)))
}

func counter(c prometheus.Counter) float64 {
	var pb dto.Metric
	if c.Write(&pb) != nil {
		return 0
	}
	return pb.GetCounter().GetValue()
}
