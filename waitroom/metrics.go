package waitroom

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	joined    prometheus.Counter
	waiting   prometheus.Gauge
	admitted  prometheus.Counter
	conns     prometheus.Gauge
	broadcast prometheus.Histogram
	deferred  prometheus.Counter
	pings     *prometheus.CounterVec
	restores  prometheus.Counter
	saves     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		joined: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_joined_total",
			Help: "Joins handled by this gateway (WebSocket and polling)."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_waitroom_waiting",
			Help: "Shoppers connected to this gateway who wait (PREQUEUE or WAITING)."}),
		admitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_admitted_total",
			Help: "Places admitted by this gateway while it led a sale's queue."}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_waitroom_connections",
			Help: "Open waiting-room WebSockets on this gateway."}),
		broadcast: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "flashsale_waitroom_broadcast_duration_seconds",
			Help:    "Time to compute and queue the status of every local connection of a sale, per tick.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8)}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_status_deferred_total",
			Help: "WAITING statuses held for a later tick by the pacing (Config.WaitingPushes)."}),
		pings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flashsale_waitroom_pings_total",
			Help: "Keep-alive pings by outcome: sent, or waited (a ping slot skipped for the sale's requests, Config.Competing)."},
			[]string{"outcome"}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_restores_total",
			Help: "Queues this gateway rebuilt in Redis (lost, or behind what it knew) from the checkpoint and its connections."}),
		saves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flashsale_waitroom_checkpoints_total",
			Help: "Queue checkpoints to the durable store by this gateway as a sale's leader, by outcome (ok, error)."},
			[]string{"outcome"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.joined, m.waiting, m.admitted, m.conns, m.broadcast, m.deferred, m.pings, m.restores, m.saves} {
			if err := reg.Register(c); err != nil {
				return m, err
			}
		}
	}
	return m, nil
}
