// Package expiry is the payment-expiry worker: an order still PENDING when
// its payment window has passed becomes EXPIRED and its unit of stock goes
// back, exactly once, even with several workers running.
//
// One transaction per batch (orderstore.Store.Expire) takes the due orders
// FOR UPDATE SKIP LOCKED (so parallel workers split the work), marks them
// EXPIRED with their events, lowers items.sold and writes a stock_returns
// outbox row per order. Only after the commit does the
// unit go back to Redis (idempotent per order), and then the row is deleted.
// A crash or a Redis outage in between leaves the rows, which the Drainer
// (orders.Service.DrainReturns) settles later.
//
// The worker is the drainer of both stock outboxes: stock_returns (units
// given back) and stock_adds (units an operator added, whose add to Redis
// failed after the commit: sales.Store.AddPending, every second). Both
// are idempotent Redis writes any number of workers may repeat. The
// order-event outbox has a drainer of its own (events.Relay, in the same
// role): its events go to Kafka once each and in order, through one
// leader at a time, which neither stock outbox needs.
package expiry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// Drainer settles stock_returns rows older than olderThan (*orders.Service).
type Drainer interface {
	DrainReturns(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// StockAdds retries the stock additions not yet in Redis (*sales.Store).
type StockAdds interface {
	AddPending(ctx context.Context) error
}

// addsEvery is how often the worker retries stock additions: an operator
// who adds units during a sale sees them sell within about a second of a
// Redis failure's end.
const addsEvery = time.Second

// Config configures a Worker.
type Config struct {
	// Interval between scans (FLASHSALE_EXPIRY_INTERVAL). 0: 30s.
	Interval time.Duration
	// BatchSize is the number of orders expired per transaction. 0: 500.
	BatchSize int
	// Now is the clock. nil: time.Now.
	Now func() time.Time
	// StaleReturn is the age at which an outbox row is taken to be stranded
	// (its writer crashed or Redis failed) and handed to the Drainer. The
	// release is idempotent per order, so a row taken while its writer is
	// still releasing costs one more script call, never a second unit; the
	// bound only spares that call in the common case. A short one keeps a
	// killed worker's units off sale for at most StaleReturn + Interval.
	// 0: 5s.
	StaleReturn time.Duration
	// OpTimeout bounds one batch (database and Redis), including the wait
	// for a pooled connection. 0: 30s.
	OpTimeout time.Duration
}

// Worker expires unpaid orders. Several may run at once, in one process or
// many.
type Worker struct {
	cfg     Config
	store   *orderstore.Store
	stock   *redisstock.Store
	returns Drainer
	adds    StockAdds
	log     *slog.Logger

	expired  prometheus.Counter
	returned prometheus.Counter
	drained  prometheus.Counter
	// backlog and oldest describe the stock_returns outbox after a round.
	backlog prometheus.Gauge
	oldest  prometheus.Gauge
}

// New returns a Worker. returns and adds may be nil (their outbox rows are
// then left to another worker); logger and reg may be nil.
func New(cfg Config, pool *pgxpool.Pool, st *redisstock.Store, returns Drainer, adds StockAdds, logger *slog.Logger, reg prometheus.Registerer) *Worker {
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StaleReturn <= 0 {
		cfg.StaleReturn = 5 * time.Second
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 30 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// Several workers in one process share the counters.
	var errs [5]error
	w := &Worker{
		cfg: cfg, store: orderstore.New(pool), stock: st, returns: returns, adds: adds,
		log: logger.With("component", "expiry"),
	}
	w.expired, errs[0] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_expiry_orders_total",
		Help: "Orders marked EXPIRED by the expiry worker.",
	}))
	w.returned, errs[1] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_expiry_stock_returned_total",
		Help: "Units given back to Redis by the expiry worker after expiring their orders.",
	}))
	w.drained, errs[2] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_expiry_outbox_drained_total",
		Help: "Stranded stock_returns rows settled by the expiry worker's drain step.",
	}))
	w.backlog, errs[3] = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_expiry_stock_returns_waiting",
		Help: "Rows of the stock_returns outbox (units owed back to Redis) at the end of the last round.",
	}))
	w.oldest, errs[4] = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "flashsale_expiry_stock_returns_oldest_seconds",
		Help: "Age of the oldest stock_returns row at the end of the last round (0: none).",
	}))
	if err := errors.Join(errs[:]...); err != nil {
		w.log.Error("expiry metrics not exported", "err", err)
	}
	return w
}

// Run expires due orders every Interval (and once at start) until ctx ends;
// it returns nil then. Errors of a round are logged and the next round
// retries.
func (w *Worker) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	a := time.NewTicker(addsEvery)
	defer a.Stop()
	for {
		n, err := w.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			w.log.Warn("expiry round failed", "expired", n, "err", err)
		} else if n > 0 {
			w.log.Info("orders expired", "expired", n)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				break wait
			case <-a.C:
				w.retryAdds(ctx)
			}
		}
	}
}

// retryAdds settles the stock additions not yet in Redis.
func (w *Worker) retryAdds(ctx context.Context) {
	if w.adds == nil {
		return
	}
	actx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	if err := w.adds.AddPending(actx); err != nil && ctx.Err() == nil {
		w.log.Warn("stock additions not yet in Redis; retrying", "err", err)
	}
}

// RunOnce expires due orders in batches until none is left (for this worker:
// rows other workers hold are theirs), then hands stranded outbox rows to the
// Drainer. It returns the number of orders this call expired.
func (w *Worker) RunOnce(ctx context.Context) (expired int, err error) {
	for ctx.Err() == nil {
		n, err := w.batch(ctx)
		expired += n
		if err != nil {
			return expired, err
		}
		if n < w.cfg.BatchSize {
			break
		}
	}
	if w.returns == nil {
		return expired, errors.Join(ctx.Err(), w.measureBacklog(ctx))
	}
	for ctx.Err() == nil {
		n, err := w.returns.DrainReturns(ctx, w.cfg.StaleReturn, w.cfg.BatchSize)
		w.drained.Add(float64(n))
		if err != nil {
			return expired, fmt.Errorf("expiry.RunOnce: %w", err)
		}
		if n < w.cfg.BatchSize {
			break
		}
	}
	return expired, errors.Join(ctx.Err(), w.measureBacklog(ctx))
}

// batch expires up to BatchSize orders in one transaction, then gives their
// units back.
func (w *Worker) batch(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	var orders []orderstore.Return
	var err error
	for attempt := 0; ; attempt++ {
		orders, err = w.store.Expire(ctx, w.cfg.Now(), w.cfg.BatchSize)
		if err == nil || attempt >= 2 || !retryable(err) {
			break
		}
	}
	if err != nil {
		return 0, fmt.Errorf("expiry: expire batch: %w", err)
	}
	if len(orders) == 0 {
		return 0, nil
	}
	w.expired.Add(float64(len(orders)))
	// Committed: now the units go back, even if ctx ends meanwhile (a
	// shutdown finishes the batch). The release is idempotent per order, so
	// a drainer racing us cannot give a unit back twice.
	ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), w.cfg.OpTimeout)
	defer cancel()
	settled := make([]string, 0, len(orders))
	var relErr error
	for _, o := range orders {
		released, err := w.stock.Release(ctx, o.SaleID, o.User, o.ItemID, o.OrderID)
		if err != nil {
			relErr = err
			break
		}
		if released {
			w.returned.Inc()
		}
		settled = append(settled, o.OrderID)
	}
	if len(settled) > 0 {
		if err := w.store.Returned(ctx, settled); err != nil && relErr == nil {
			relErr = fmt.Errorf("delete outbox rows: %w", err)
		}
	}
	if relErr != nil {
		return len(orders), fmt.Errorf("expiry: %d of %d units left to the outbox: %w", len(orders)-len(settled), len(orders), relErr)
	}
	return len(orders), nil
}

// retryable reports a deadlock or serialization failure, which a fresh
// transaction may not meet again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// measureBacklog sets the outbox gauges: rows left after the round are
// units that Redis still owes the shop, which an alert watches.
func (w *Worker) measureBacklog(ctx context.Context) error {
	if ctx.Err() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	n, oldest, err := w.store.Backlog(ctx)
	if err != nil {
		return fmt.Errorf("expiry: outbox backlog: %w", err)
	}
	w.backlog.Set(float64(n))
	w.oldest.Set(max(oldest, 0))
	return nil
}
