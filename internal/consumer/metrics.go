package consumer

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the runtime's Prometheus collectors.
type Metrics struct {
	messages       *prometheus.CounterVec
	deadLetters    *prometheus.CounterVec
	handlerSeconds *prometheus.HistogramVec
	endToEnd       *prometheus.HistogramVec
	reconnects     *prometheus.CounterVec
	pauses         *prometheus.CounterVec
	panics         *prometheus.CounterVec
	ready          *prometheus.GaugeVec
	batchSize      *prometheus.HistogramVec
	blocked        *prometheus.GaugeVec
	commitSeconds  *prometheus.HistogramVec
}

// NewMetrics creates the collectors and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_messages_total",
			Help: "Messages settled, by consumer and outcome (processed, duplicate, declined, retried, dead_lettered).",
		}, []string{"consumer", "outcome"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_dead_letters_total",
			Help: "Messages sent to the dead-letter exchange, by consumer and reason.",
		}, []string{"consumer", "reason"}),
		handlerSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "consumer_handler_duration_seconds",
			Help:    "Time spent in the handler (outside calls; no transaction open).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"consumer"}),
		endToEnd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "consumer_end_to_end_seconds",
			Help: "From the message's publish time (timestamp_in_ms header, else the AMQP timestamp) to the commit of its effects.",
			// 1 ms to about 70 s in steps of 25%, fine enough for percentiles.
			Buckets: prometheus.ExponentialBuckets(0.001, 1.25, 50),
		}, []string{"consumer"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_reconnects_total",
			Help: "Broker sessions re-established after a connection or channel was lost.",
		}, []string{"consumer"}),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_pauses_total",
			Help: "Times consumption paused because the infrastructure failed every message, by cause (database, or a dependency's cause such as gateway_misconfigured).",
		}, []string{"consumer", "cause"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_handler_panics_total",
			Help: "Handler panics recovered.",
		}, []string{"consumer"}),
		ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "consumer_ready",
			Help: "1 while consuming, 0 while disconnected or paused.",
		}, []string{"consumer"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "consumer_commit_batch_size",
			Help:    "Messages committed per inbox transaction (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"consumer"}),
	}
	m.blocked = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "consumer_publishing_blocked",
		Help: "1 while the broker blocks the publishing connection (a memory or disk alarm).",
	}, []string{"consumer"})
	m.commitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "consumer_commit_duration_seconds",
		Help:    "Time of one inbox transaction: the claims, the handlers' writes and the COMMIT.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"consumer"})
	reg.MustRegister(m.messages, m.deadLetters, m.handlerSeconds, m.endToEnd, m.reconnects, m.pauses, m.panics, m.ready, m.batchSize, m.blocked, m.commitSeconds)
	return m
}

// Settled reports how many messages of consumer were settled with outcome.
func (m *Metrics) Settled(consumer string, outcome Outcome) int {
	c, err := m.messages.GetMetricWithLabelValues(consumer, string(outcome))
	if err != nil {
		return 0
	}
	var pb dto.Metric
	if c.Write(&pb) != nil {
		return 0
	}
	return int(pb.GetCounter().GetValue())
}
