// Package e2e runs the load harness against a whole in-process stack
// (internal/app on real Redis, PostgreSQL and kfake) at small N:
//
//	go test -race -count=1 ./loadtest/...
package e2e

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/app"
	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/loadtest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const secret = "loadtest-e2e-secret"

func startApp(t *testing.T) *app.App {
	t.Helper()
	cfg := app.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.RedisURL = testenv.RedisURL(t)
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.KafkaBrokers = testenv.NewKafka(t).Brokers
	cfg.JWTSecret = secret
	cfg.ExpiryInterval = 200 * time.Millisecond
	a, err := app.Start(context.Background(), cfg, app.AllRoles, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("app.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return a
}

func TestSmokeAgainstStack(t *testing.T) {
	for _, transport := range []string{loadtest.TransportWS, loadtest.TransportPolling} {
		t.Run(transport, func(t *testing.T) {
			a := startApp(t)
			cfg, err := loadtest.Scenario("smoke")
			if err != nil {
				t.Fatal(err)
			}
			cfg.BaseURL, cfg.AdminURL, cfg.JWTSecret = a.PublicURL, a.AdminURL, secret
			cfg.RedisURL, cfg.DatabaseURL = testenv.RedisURL(t), testenv.DatabaseURL(t)
			cfg.Transport = transport
			cfg.PollInterval = 200 * time.Millisecond
			cfg.SourceAddrs = 8
			cfg.Duration = 45 * time.Second
			r, err := loadtest.Run(context.Background(), cfg)
			if r != nil {
				var b bytes.Buffer
				r.WriteJSON(&b)
				t.Logf("report: %s", b.String())
			}
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if r.Orders.Sold != r.Orders.Quantity {
				t.Errorf("sold %d of %d with %d shoppers", r.Orders.Sold, r.Orders.Quantity, r.Shoppers)
			}
			if r.Orders.Reserved == 0 || r.Orders.Paid == 0 {
				t.Errorf("orders = %+v", r.Orders)
			}
			if r.Redis == nil || r.Redis.HostileRequests == 0 {
				t.Errorf("redis report = %+v", r.Redis)
			}
		})
	}
}
