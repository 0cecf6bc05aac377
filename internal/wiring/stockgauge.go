package wiring

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/sales"
)

// stockCollector exports the remaining stock of every item of the sales
// not yet ended, read from Redis when Prometheus scrapes: the figure the
// purchase path sells from, with no loop to keep it fresh.
type stockCollector struct {
	cache *sales.Cache
	stock *redisstock.Store
	now   func() time.Time
	desc  *prometheus.Desc
}

// registerStockGauge exports flashsale_sale_stock_remaining.
func (a *App) registerStockGauge() error {
	_, err := prom.Register(a.reg, newStockCollector(a.cache, a.stock))
	return err
}

func newStockCollector(cache *sales.Cache, stock *redisstock.Store) *stockCollector {
	return &stockCollector{cache: cache, stock: stock, now: time.Now,
		desc: prometheus.NewDesc("flashsale_sale_stock_remaining",
			"Units left to reserve in Redis, per item of each sale not yet ended (read at scrape time).",
			[]string{"sale", "item"}, nil)}
}

func (c *stockCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads each live sale's stock within one bounded call per sale;
// a sale whose stock can not be read is left out of the scrape.
func (c *stockCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, s := range c.cache.Sales() {
		if !s.EndsAt.IsZero() && now.After(s.EndsAt) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		rem, err := c.stock.Remaining(ctx, s.ID)
		cancel()
		if err != nil {
			continue
		}
		sale := strconv.FormatInt(s.ID, 10)
		for _, it := range s.Items {
			if n, ok := rem[it.ID]; ok {
				ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), sale, strconv.FormatInt(it.ID, 10))
			}
		}
	}
}
