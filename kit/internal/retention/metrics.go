package retention

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the pruner's Prometheus collectors.
type Metrics struct {
	pruned         *prometheus.CounterVec
	prunedBuffered *prometheus.CounterVec
	prunedOutbox   *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_pruned_rows_total",
			Help: "Inbox rows deleted by retention, by consumer.",
		}, []string{"consumer"}),
		prunedBuffered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_buffered_pruned_messages_total",
			Help: "Finished messages of the buffered inbox deleted by retention, by consumer.",
		}, []string{"consumer"}),
		prunedOutbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_pruned_rows_total",
			Help: "Sent outbox rows deleted by retention, by producer.",
		}, []string{"consumer"}),
	}
	reg.MustRegister(m.pruned, m.prunedBuffered, m.prunedOutbox)
	return m
}
