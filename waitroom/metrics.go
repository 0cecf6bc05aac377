package waitroom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
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
	tags      prometheus.Counter
	published *prometheus.CounterVec
	leading   prometheus.Gauge
	shadowed  *prometheus.CounterVec
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
		tags: prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_waitroom_draw_tags_total",
			Help: "Member tags this gateway computed for public draw records (only the leader, once per sale at the draw)."}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flashsale_waitroom_draw_records_total",
			Help: "Public draw records this gateway built and stored as a sale's leader, by outcome (ok, error)."},
			[]string{"outcome"}),
		leading: prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_waitroom_leading_sales",
			Help: "Sales whose queue this gateway leads (it holds the leader lease): with one sale running, 1 on its leader and 0 on every other gateway."}),
		shadowed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "flashsale_waitroom_shadowed_total",
			Help: "Shoppers this gateway sent to a sale's shadow queue, by rule (the bot defense's shadowQueue)."},
			[]string{"rule"}),
	}
	// Several rooms on one registry share the collectors.
	var errs [13]error
	m.joined, errs[0] = prom.Register(reg, m.joined)
	m.waiting, errs[1] = prom.Register(reg, m.waiting)
	m.admitted, errs[2] = prom.Register(reg, m.admitted)
	m.conns, errs[3] = prom.Register(reg, m.conns)
	m.broadcast, errs[4] = prom.Register(reg, m.broadcast)
	m.deferred, errs[5] = prom.Register(reg, m.deferred)
	m.pings, errs[6] = prom.Register(reg, m.pings)
	m.restores, errs[7] = prom.Register(reg, m.restores)
	m.saves, errs[8] = prom.Register(reg, m.saves)
	m.tags, errs[9] = prom.Register(reg, m.tags)
	m.published, errs[10] = prom.Register(reg, m.published)
	m.leading, errs[11] = prom.Register(reg, m.leading)
	m.shadowed, errs[12] = prom.Register(reg, m.shadowed)
	return m, errors.Join(errs[:]...)
}
