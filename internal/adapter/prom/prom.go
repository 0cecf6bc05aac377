// Package prom registers Prometheus collectors for the components. It is
// the one place that decides what a second registration of the same metric
// means: the collector registered first is shared, anything else is an
// error the caller reports.
package prom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it. When reg already holds an
// identical collector (same names, help and labels, of c's type) it returns
// that one instead, so that several components of one process, or several
// tests, count into one metric. Any other failure is returned with c, which
// then counts but is not exported. A nil reg registers nothing.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("prom.Register: %w", err)
}
