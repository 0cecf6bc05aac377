package purchase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/stock"
)

// SaleLister lists the sales to reconcile (*sales.Cache).
type SaleLister interface {
	Sales() []*flashsale.Sale
}

// ReconcilerConfig configures a Reconciler. Zero fields take the defaults.
type ReconcilerConfig struct {
	// After is the age past which a reservation still pending in Redis
	// (neither confirmed by the writer nor given back) is taken as lost
	// (default 2m). It must exceed the usual Kafka-to-database delay:
	// a reservation older than this that the writer has not stored yet is
	// rejected, and the writer's late insert then finds the tombstone.
	After time.Duration
	// Interval between runs (default 10s).
	Interval time.Duration
	// PaymentWindow sets expires_at of the tombstone rows (default 10m).
	PaymentWindow time.Duration
	// Batch is the number of pending reservations read per round trip
	// (default 500).
	Batch int64
	Now   func() time.Time // nil: time.Now
}

// Defaults of ReconcilerConfig.
const (
	DefaultReconcileAfter    = 2 * time.Minute
	DefaultReconcileInterval = 10 * time.Second
	DefaultPaymentWindow     = 10 * time.Minute
)

// RejectLost is the reject_reason of a tombstone row.
const RejectLost = "never reached the database"

// Reconciler returns reservations that were taken in Redis but never reached
// the database (invariant 3), and rebuilds a sale's Redis stock from the
// database when Redis lost it.
//
// For each pending reservation older than After, in one transaction, it
// inserts a REJECTED tombstone order row with the reservation's order id
// (ON CONFLICT (id) DO NOTHING) and, when the insert took, a stock_returns
// outbox row; after the commit it gives the unit back in Redis and deletes
// the outbox row. If the order row existed already (the writer stored the
// order but stopped before confirming it in Redis), it only confirms. Several
// reconcilers may run at once: the primary key makes the tombstone once, and
// the release script gives a unit back once per order.
//
// Redis data loss: when a sale's stock record is missing in Redis, it is
// rebuilt from PostgreSQL (remaining = quantity − live orders, and a buyer
// record per live order), writing only fields that are missing. Reservations
// that existed only in Redis or Kafka at the moment of the loss are not in
// that count: their units are sold again, and when such an order reaches the
// writer later, the database (CHECK sold <= quantity, one live order per user
// per sale) rejects any that would oversell or duplicate a buyer.
type Reconciler struct {
	after, interval, window time.Duration
	batch                   int64
	now                     func() time.Time
	pool                    *pgxpool.Pool
	st                      *stock.Store
	sales                   SaleLister
	log                     *slog.Logger

	returned, confirmed, rebuilt, failures prometheus.Counter
}

// NewReconciler returns a Reconciler. reg may be nil.
func NewReconciler(cfg ReconcilerConfig, pool *pgxpool.Pool, st *stock.Store, sales SaleLister, logger *slog.Logger, reg prometheus.Registerer) *Reconciler {
	if cfg.After <= 0 {
		cfg.After = DefaultReconcileAfter
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultReconcileInterval
	}
	if cfg.PaymentWindow <= 0 {
		cfg.PaymentWindow = DefaultPaymentWindow
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 500
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	counter := func(name, help string) prometheus.Counter {
		return register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_purchase_reconciler_" + name, Help: help}))
	}
	return &Reconciler{
		after: cfg.After, interval: cfg.Interval, window: cfg.PaymentWindow, batch: cfg.Batch, now: cfg.Now,
		pool: pool, st: st, sales: sales, log: logger.With("component", "reconciler"),
		returned:  counter("returned_total", "Lost reservations whose unit went back to stock."),
		confirmed: counter("confirmed_total", "Stale reservations found stored in the database and confirmed."),
		rebuilt:   counter("rebuilt_items_total", "Item stock records rebuilt from the database after Redis lost them."),
		failures:  counter("errors_total", "Reconciler runs that ended with an error."),
	}
}

// Run reconciles every Interval until ctx ends; it returns nil then.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, max(r.interval, 30*time.Second))
		n, err := r.RunOnce(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.Warn("reconcile failed", "err", err, "returned", n)
		} else if n > 0 {
			r.log.Info("returned lost reservations", "returned", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// RunOnce reconciles every sale once and reports how many units went back to
// stock.
func (r *Reconciler) RunOnce(ctx context.Context) (returned int, err error) {
	cutoff := r.now().Add(-r.after)
	var errs []error
	for _, sale := range r.sales.Sales() {
		if err := r.rebuildIfLost(ctx, sale); err != nil {
			errs = append(errs, fmt.Errorf("sale %d: %w", sale.ID, err))
			continue
		}
		n, err := r.reconcileSale(ctx, sale, cutoff)
		returned += n
		if err != nil {
			errs = append(errs, fmt.Errorf("sale %d: %w", sale.ID, err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.failures.Inc()
		return returned, fmt.Errorf("purchase.Reconciler.RunOnce: %w", err)
	}
	return returned, nil
}

func (r *Reconciler) reconcileSale(ctx context.Context, sale *flashsale.Sale, cutoff time.Time) (int, error) {
	returned := 0
	for {
		ps, err := r.st.PendingBefore(ctx, sale.ID, cutoff, r.batch)
		if err != nil {
			return returned, err
		}
		var errs []error
		for _, p := range ps {
			ok, err := r.settle(ctx, sale, p)
			if err != nil {
				errs = append(errs, fmt.Errorf("order %s: %w", p.OrderID, err))
				continue
			}
			if ok {
				returned++
			}
		}
		// Every settled reservation left the pending set; on errors, stop
		// here rather than read the same failing ones again.
		if len(errs) > 0 || int64(len(ps)) < r.batch {
			return returned, errors.Join(errs...)
		}
	}
}

// settle decides one stale reservation; it reports whether its unit went
// back to stock.
func (r *Reconciler) settle(ctx context.Context, sale *flashsale.Sale, p stock.Pending) (bool, error) {
	if _, err := uuid.Parse(p.OrderID); err != nil {
		// No order row can carry this id, so none exists: give it back.
		return r.st.Release(ctx, sale.ID, p.UserID, p.ItemID, p.OrderID)
	}
	var price int64
	if it, ok := sale.Item(p.ItemID); ok {
		price = it.PriceCents
	}
	var inserted bool
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO orders
			(id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at, reject_reason)
			VALUES ($1, $2, $3, $4, 'REJECTED', $5, $6, $7, $8)
			ON CONFLICT (id) DO NOTHING`,
			p.OrderID, sale.ID, p.ItemID, p.UserID, price, p.ReservedAt, p.ReservedAt.Add(r.window), RejectLost)
		if err != nil {
			return err
		}
		inserted = tag.RowsAffected() == 1
		if !inserted {
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO stock_returns (order_id, sale_id, item_id, user_id)
			VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING`, p.OrderID, sale.ID, p.ItemID, p.UserID)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("tombstone: %w", err)
	}
	if !inserted {
		// The order is in the database. Its unit goes back only if an
		// outbox row says so (a tombstone or a rejection whose release
		// did not finish); otherwise the writer stored it and stopped
		// before confirming.
		var owed bool
		if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM stock_returns WHERE order_id = $1)`, p.OrderID).Scan(&owed); err != nil {
			return false, fmt.Errorf("outbox: %w", err)
		}
		if !owed {
			if err := r.st.Confirm(ctx, []stock.Pending{p}); err != nil {
				return false, err
			}
			r.confirmed.Inc()
			return false, nil
		}
	}
	// Redis only after the commit; the outbox row covers a crash here.
	ok, err := r.st.Release(ctx, sale.ID, p.UserID, p.ItemID, p.OrderID)
	if err != nil {
		return false, err
	}
	if _, err := r.pool.Exec(ctx, `DELETE FROM stock_returns WHERE order_id = $1`, p.OrderID); err != nil {
		return ok, fmt.Errorf("outbox delete: %w", err)
	}
	if ok {
		r.returned.Inc()
	}
	return ok, nil
}

// rebuildIfLost rebuilds the sale's Redis stock and buyer records from the
// database when Redis has no stock record for some of its items.
func (r *Reconciler) rebuildIfLost(ctx context.Context, sale *flashsale.Sale) error {
	if len(sale.Items) == 0 {
		return nil
	}
	ids := make([]int64, len(sale.Items))
	for i, it := range sale.Items {
		ids[i] = it.ID
	}
	left, err := r.st.ItemsRemaining(ctx, sale.ID, ids)
	if err != nil {
		return err
	}
	missing := map[int64]bool{}
	for i, n := range left {
		if n < 0 {
			missing[ids[i]] = true
		}
	}
	if len(missing) == 0 {
		return nil
	}
	quantity := map[int64]int64{}
	live := map[int64]int64{}
	buyers := map[int64]stock.Buyer{}
	// One snapshot of items and live orders.
	err = pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, quantity FROM items WHERE sale_id = $1`, sale.ID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id, q int64
			if err := rows.Scan(&id, &q); err != nil {
				return err
			}
			quantity[id] = q
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT id::text, item_id, user_id, created_at FROM orders
			WHERE sale_id = $1 AND status IN ('PENDING', 'PAID')`, sale.ID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var b stock.Buyer
			var user int64
			if err := rows.Scan(&b.OrderID, &b.ItemID, &user, &b.CreatedAt); err != nil {
				return err
			}
			live[b.ItemID]++
			buyers[user] = b
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("rebuild: read database: %w", err)
	}
	remaining := make(map[int64]int64, len(missing))
	for id := range missing {
		q, ok := quantity[id]
		if !ok {
			continue // not in the database: nothing to rebuild from
		}
		remaining[id] = max(q-live[id], 0)
	}
	n, err := r.st.Restore(ctx, sale.ID, remaining, buyers)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	if n > 0 {
		r.rebuilt.Add(float64(n))
		r.log.Warn("rebuilt stock from the database after Redis lost it", "sale", sale.ID, "items", n, "liveOrders", len(buyers))
	}
	return nil
}
