package wiring

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
)

// dependencyProbeInterval is how often every process checks its
// dependencies for the flashsale_dependency_up gauges, so that an alert
// sees an outage whether or not anything calls /readyz.
const dependencyProbeInterval = 5 * time.Second

// probeTimeout bounds one round of checks (the /readyz ones too).
const probeTimeout = 2 * time.Second

// startDependencyProbe registers flashsale_dependency_up{dependency} and
// probes every dependencyProbeInterval until runCtx ends.
func (a *App) startDependencyProbe(runCtx context.Context) error {
	g, err := prom.Register(a.reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "flashsale_dependency_up",
		Help: "1 when the last check reached the dependency (redis, postgres: with the current schema, kafka), 0 when it did not.",
	}, []string{"dependency"}))
	if err != nil {
		return err
	}
	a.depUp = g
	_ = a.probe(runCtx)
	a.goRun("dependency-probe", func() error {
		t := time.NewTicker(dependencyProbeInterval)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return nil
			case <-t.C:
			}
			_ = a.probe(runCtx)
		}
	})
	return nil
}

// probe checks Redis, PostgreSQL (and the schema) and Kafka at once, each
// within probeTimeout so that one that hangs does not mark the others
// down, sets their gauges and returns the first failure (in that order).
func (a *App) probe(ctx context.Context) error {
	checks := [...]struct {
		dep string
		run func(context.Context) error
	}{
		{"redis", func(ctx context.Context) error {
			if err := redisconn.Ping(ctx, a.rdb); err != nil {
				return fmt.Errorf("redis: %w", err)
			}
			return nil
		}},
		{"postgres", func(ctx context.Context) error { return postgres.CheckSchema(ctx, a.pool) }},
		{"kafka", func(ctx context.Context) error { return a.kping.Ping(ctx) }},
	}
	var errs [len(checks)]error
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			errs[i] = c.run(cctx)
		})
	}
	wg.Wait()
	for i, c := range checks {
		up := 1.0
		if errs[i] != nil {
			up = 0
		}
		if a.depUp != nil {
			a.depUp.WithLabelValues(c.dep).Set(up)
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
