package loadtest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

func TestCreateSaleValidatesBeforeSending(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	hc := newHTTPClient(nil)
	t.Cleanup(hc.closeIdle)
	a := &admin{hc: hc, bases: []string{srv.URL}}
	ok := Config{Quantity: 10, Items: 2, AdmissionRate: 100, StartsIn: time.Second}
	tests := []struct {
		name   string
		change func(c *Config)
		want   string
	}{
		{"rate negative", func(c *Config) { c.AdmissionRate = -1 }, "admissionRatePerSecond: must be at least 1"},
		{"too many items", func(c *Config) { c.Items, c.Quantity = flashsale.MaxSaleItems+1, 2*flashsale.MaxSaleItems }, "items: at most 1000 items"},
		{"long scenario", func(c *Config) { c.Scenario = strings.Repeat("s", flashsale.MaxSaleNameLen) }, "name: at most 200 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.change(&cfg)
			_, err := a.createSale(context.Background(), cfg, time.Now())
			if got := flashsale.ErrorCode(err); got != flashsale.CodeInvalid {
				t.Errorf("code: got %q (%v), want %q", got, err, flashsale.CodeInvalid)
			}
			if got := flashsale.ErrorMessage(err); got != tt.want {
				t.Errorf("message: got %q, want %q", got, tt.want)
			}
		})
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests sent for invalid sales, want 0", n)
	}
	if _, err := a.createSale(context.Background(), ok, time.Now()); err == nil || requests.Load() != 1 {
		t.Errorf("valid sale: got %v after %d requests, want the server's error after 1", err, requests.Load())
	}
}
