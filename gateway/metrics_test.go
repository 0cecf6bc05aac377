package gateway

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNewMetricsRegistration(t *testing.T) {
	t.Run("second server shares the collectors", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		first, err := newMetrics(reg)
		if err != nil {
			t.Fatalf("first newMetrics: %v", err)
		}
		second, err := newMetrics(reg)
		if err != nil {
			t.Fatalf("second newMetrics: %v", err)
		}
		if got, want := second.requests, first.requests; got != want {
			t.Errorf("second requests = %p, want the first's %p", got, want)
		}
	})
	t.Run("conflict is an error, not a panic", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_gateway_requests_total", Help: "Another metric."}))
		m, err := newMetrics(reg)
		if err == nil {
			t.Fatal("newMetrics: got no error, want the conflict")
		}
		if m == nil || m.requests == nil || m.unrouted == nil {
			t.Fatal("newMetrics: got no metrics, want unexported ones that still count")
		}
	})
}
