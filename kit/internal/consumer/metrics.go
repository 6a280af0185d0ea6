package consumer

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/inbox-template/payment-service/kit/internal/buffered"
)

// Metrics are the runtime's Prometheus collectors.
type Metrics struct {
	messages       *prometheus.CounterVec
	deadLetters    *prometheus.CounterVec
	handlerSeconds *prometheus.HistogramVec
	endToEnd       *prometheus.HistogramVec
	reconnects     *prometheus.CounterVec
	failovers      *prometheus.CounterVec
	pauses         *prometheus.CounterVec
	panics         *prometheus.CounterVec
	ready          *prometheus.GaugeVec
	batchSize      *prometheus.HistogramVec
	blocked        *prometheus.GaugeVec
	commitSeconds  *prometheus.HistogramVec
	// The buffered mode's.
	buffered        *prometheus.GaugeVec
	oldest          *prometheus.GaugeVec
	blockedKeys     *prometheus.GaugeVec
	blockedMessages *prometheus.GaugeVec
	claimSeconds    *prometheus.HistogramVec
	parked          *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_messages_total",
			Help: "Messages settled, by consumer and outcome (processed, duplicate, a handler's own such as declined, retried, requeued, dead_lettered; buffered mode: stored, parked).",
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
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_broker_failovers_total",
			Help: "Broker sessions opened on another node of AMQP_URL than the session before (a cluster node lost).",
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
	reg.MustRegister(m.messages, m.deadLetters, m.handlerSeconds, m.endToEnd, m.reconnects, m.failovers, m.pauses, m.panics, m.ready, m.batchSize, m.blocked, m.commitSeconds)
	m.registerBuffered(reg)
	return m
}

// registerBuffered adds the buffered mode's collectors; in the inline mode
// they stay empty and export nothing.
func (m *Metrics) registerBuffered(reg prometheus.Registerer) {
	m.buffered = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inbox_buffered_messages",
		Help: "Stored messages not yet finished, by status (pending, processing, failed, parked); read from the table every 10s by each replica.",
	}, []string{"consumer", "status"})
	m.oldest = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inbox_buffered_oldest_unprocessed_seconds",
		Help: "Age of the oldest stored message still to process (pending, processing or failed): the processing lag; 0 when there is none.",
	}, []string{"consumer"})
	m.blockedKeys = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inbox_buffered_blocked_keys",
		Help: "Ordering keys whose head message is parked, waiting for an operator.",
	}, []string{"consumer"})
	m.blockedMessages = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "inbox_buffered_blocked_messages",
		Help: "Stored messages waiting behind a parked head of their key.",
	}, []string{"consumer"})
	m.claimSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "inbox_buffered_claim_duration_seconds",
		Help:    "Time of one claim statement (leasing up to 64 due messages).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"consumer"})
	m.parked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_parked_total",
		Help: "Stored messages parked (buffered mode), by consumer and reason.",
	}, []string{"consumer", "reason"})
	reg.MustRegister(m.buffered, m.oldest, m.blockedKeys, m.blockedMessages, m.claimSeconds, m.parked)
}

// setBuffered sets the buffered mode's gauges from the table's stats.
func (m *Metrics) setBuffered(consumer string, st buffered.Stats) {
	for _, s := range []buffered.Status{buffered.StatusPending, buffered.StatusProcessing, buffered.StatusFailed, buffered.StatusParked} {
		m.buffered.WithLabelValues(consumer, string(s)).Set(float64(st.Counts[s]))
	}
	lag := 0.0
	if !st.OldestUnfinished.IsZero() {
		lag = max(0, st.Now.Sub(st.OldestUnfinished).Seconds())
	}
	m.oldest.WithLabelValues(consumer).Set(lag)
	m.blockedKeys.WithLabelValues(consumer).Set(float64(st.BlockedKeys))
	m.blockedMessages.WithLabelValues(consumer).Set(float64(st.BlockedMessages))
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
