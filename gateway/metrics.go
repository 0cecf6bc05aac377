package gateway

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
)

// metrics are the request counters and latency histograms. Labels are
// bounded: route is one of the names given in routes(), code one of
// trackedStatuses or "other".
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	timeouts *prometheus.CounterVec // connections closed by the watchdog, by reason
	// pendingRefused counts connections closed at accept because their
	// address held Config.MaxPendingPerAddr connections without a first
	// request.
	pendingRefused prometheus.Counter
	// drawLoads counts draw records read from the store (a miss of the
	// gateway's cache).
	drawLoads prometheus.Counter

	mu       sync.Mutex
	routes   map[string]*routeMetrics
	unrouted *routeMetrics
}

var trackedStatuses = [...]int{101, 200, 201, 202, 204, 304, 400, 401, 403, 404, 405, 408, 409, 410, 413, 429, 431, 500, 503}

// statusSlot maps an HTTP status to its index in trackedStatuses, or the
// "other" slot.
var statusSlot = func() (t [600]uint8) {
	for i := range t {
		t[i] = uint8(len(trackedStatuses))
	}
	for i, st := range trackedStatuses {
		t[st] = uint8(i)
	}
	return t
}()

type routeMetrics struct {
	name     string
	vec      *prometheus.CounterVec
	latency  prometheus.Observer
	counters [len(trackedStatuses) + 1]atomic.Pointer[prometheus.Counter]
}

// newMetrics builds the gateway's metrics on reg. On a registration error
// they still count, unexported.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_gateway_requests_total",
			Help: "HTTP requests answered by the gateway, by route and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "flashsale_gateway_request_duration_seconds",
			Help:    "Time to answer a request, by route.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashsale_gateway_connections_timed_out_total",
			Help: "Connections the gateway closed for a timeout: head (a new connection's first request head not complete within the head timeout of its first byte), read (a later request that took too long to arrive), idle (a new connection that sent nothing within the first-byte timeout, or a keep-alive one waiting for its next request past the idle timeout) or write (a client not reading).",
		}, []string{"reason"}),
		pendingRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_gateway_pending_connections_refused_total",
			Help: "New connections closed at once because their client address (an IPv4 address, an IPv6 /64) already held the most connections allowed without a first request (FLASHSALE_MAX_PENDING_CONNS_PER_ADDR).",
		}),
		drawLoads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flashsale_gateway_draw_loads_total",
			Help: "Public draw records this gateway read from the store: misses of its in-memory cache, and NOT_DRAWN rechecks.",
		}),
		routes: make(map[string]*routeMetrics),
	}
	// A second Server on one registry shares the first one's collectors.
	var errs [5]error
	m.requests, errs[0] = prom.Register(reg, m.requests)
	m.timeouts, errs[1] = prom.Register(reg, m.timeouts)
	m.latency, errs[2] = prom.Register(reg, m.latency)
	m.pendingRefused, errs[3] = prom.Register(reg, m.pendingRefused)
	m.drawLoads, errs[4] = prom.Register(reg, m.drawLoads)
	m.unrouted = m.route("unmatched")
	return m, errors.Join(errs[:]...)
}

func (m *metrics) route(name string) *routeMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.routes[name]; ok {
		return r
	}
	r := &routeMetrics{name: name, vec: m.requests, latency: m.latency.WithLabelValues(name)}
	m.routes[name] = r
	return r
}

// observe counts one answer; d <= 0 skips the latency histogram.
func (r *routeMetrics) observe(status int, d time.Duration) {
	slot := len(trackedStatuses)
	if status >= 0 && status < len(statusSlot) {
		slot = int(statusSlot[status])
	}
	p := r.counters[slot].Load()
	if p == nil {
		code := "other"
		if slot < len(trackedStatuses) {
			code = strconv.Itoa(trackedStatuses[slot])
		}
		c := r.vec.WithLabelValues(r.name, code)
		r.counters[slot].CompareAndSwap(nil, &c)
		p = r.counters[slot].Load()
	}
	(*p).Inc()
	if d > 0 {
		r.latency.Observe(d.Seconds())
	}
}
