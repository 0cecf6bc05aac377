package wiring

import (
	"context"
	"fmt"
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

// probe checks Redis, PostgreSQL (and the schema) and Kafka, sets their
// gauges and returns the first failure.
func (a *App) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var errs []error
	check := func(dep string, err error) {
		up := 1.0
		if err != nil {
			up = 0
			errs = append(errs, err)
		}
		if a.depUp != nil {
			a.depUp.WithLabelValues(dep).Set(up)
		}
	}
	err := redisconn.Ping(ctx, a.rdb)
	if err != nil {
		err = fmt.Errorf("redis: %w", err)
	}
	check("redis", err)
	check("postgres", postgres.CheckSchema(ctx, a.pool))
	check("kafka", a.kping.Ping(ctx))
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}
