package prom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
)

func TestRegister(t *testing.T) {
	opts := prometheus.CounterOpts{Name: "flashsale_test_things_total", Help: "Things."}
	tests := []struct {
		name    string
		nilReg  bool
		before  prometheus.Collector // registered first; nil: nothing
		wantOld bool                 // the collector registered before comes back
		wantErr bool
	}{
		{name: "nil registerer", nilReg: true},
		{name: "new"},
		{name: "identical reused", before: prometheus.NewCounter(opts), wantOld: true},
		{name: "same name other help", before: prometheus.NewCounter(prometheus.CounterOpts{Name: opts.Name, Help: "Other."}), wantErr: true},
		{name: "same name other type", before: prometheus.NewHistogram(prometheus.HistogramOpts{Name: opts.Name, Help: opts.Help}), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var reg prometheus.Registerer
			if !tc.nilReg {
				r := prometheus.NewPedanticRegistry()
				if tc.before != nil {
					r.MustRegister(tc.before)
				}
				reg = r
			}
			c := prometheus.NewCounter(opts)
			got, err := prom.Register(reg, c)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tc.wantErr)
			}
			want := prometheus.Collector(c)
			if tc.wantOld {
				want = tc.before
			}
			if got != want {
				t.Errorf("got collector %p, want %p", got, want)
			}
		})
	}
}
