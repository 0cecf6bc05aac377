// Package reconcile settles what the purchase path leaves unsettled: the
// reservations that never reached the database (the reconcile pass), the
// reservations in flight under a gateway's lapsed placement lease (the
// reclaim, reclaim.go), and a sale's stock records after Redis lost them
// (the rebuild, rebuild.go). It runs in the gateway role beside the purchase service
// and shares no memory with it: both read and write the reservation
// records through redisstock, the order rows through the order store, and
// the reconciler asks Kafka through OrderLog.
//
// It imports no other component. The purchase path's bounds it counts on
// (a reservation's script call, its record's publish) are redisstock's
// constants, read by both. The placement Leaser stays in purchase: the
// purchase service consults it on every reservation (Slot, Holds) and the
// reconciler only needs the lease TTL (Config.LeaseTTL) and the leases'
// records in Redis (redisstock).
//
// Its metrics are named flashsale_purchase_reconciler_*, not after this
// package: the alerts and dashboards (deploy/) read those names.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// SaleLister lists the sales to reconcile (*sales.Cache).
type SaleLister interface {
	Sales() []*flashsale.Sale
}

// OrderLog is what the Reconciler asks Kafka (*kafka.OrderLog): how far the
// writer's consumer group got in the orders topic, and the orders it has not
// consumed yet.
type OrderLog interface {
	// Progress returns per partition the group's committed offset (the
	// next record the writer reads) and the end offset, the end read
	// first.
	Progress(ctx context.Context) (committed, end map[int32]int64, err error)
	// Unconsumed returns the orders of the records from committed to end.
	Unconsumed(ctx context.Context, committed, end map[int32]int64) ([]kafka.LoggedOrder, error)
}

// Config configures a Reconciler. Zero fields take the defaults.
type Config struct {
	// After is the age past which a reservation still pending in Redis
	// (neither confirmed by the writer nor given back) is looked at
	// (default 2m). It is declared lost only when Kafka proves its record
	// never reached the broker (see Reconciler); otherwise it waits for the
	// writer, however long that takes.
	After time.Duration
	// Orders is the orders topic as the writer's group sees it. Nil means
	// no Kafka to ask: a stale reservation without a row is declared lost
	// (for tests of the database rules only; every role wires it).
	Orders OrderLog
	// PublishTimeout is the purchase service's publish bound (default
	// redisstock.DefaultPublishTimeout, the purchase service's default).
	// A record acknowledged at all was so within
	// redisstock.DefaultReserveTimeout + PublishTimeout of its
	// reservation. Without leases (LeaseTTL 0) a Redis-loss rebuild waits
	// it after the loss was seen, so that every reservation taken before
	// has been published (or failed).
	PublishTimeout time.Duration
	// LossCheck is how often Run looks for sales whose stock record Redis
	// lost (default 250ms), apart from the slower reconcile pass: a loss
	// is rebuilt up to one LossCheck after it happens and one more after
	// its wait ends, both counted in the sale's recovery.
	LossCheck time.Duration
	// Interval between runs (default 10s).
	Interval time.Duration
	// PaymentWindow sets expires_at of the tombstone rows (default 10m).
	PaymentWindow time.Duration
	// Batch is the number of pending reservations read per round trip
	// (default 500).
	Batch int64
	// LeaseTTL is the gateways' placement lease TTL (purchase's
	// Leaser.TTL); 0: no
	// leases to watch. The reservations in flight under a lease that
	// lapsed are settled at once (reclaim.go).
	LeaseTTL time.Duration
	Now      func() time.Time // nil: time.Now
}

// Defaults of Config.
const (
	DefaultAfter         = 2 * time.Minute
	DefaultInterval      = 10 * time.Second
	DefaultPaymentWindow = 10 * time.Minute
	DefaultLossCheck     = 250 * time.Millisecond
)

// RejectLost is the reject_reason of a tombstone row.
const RejectLost = "never reached the database"

// Reconciler returns reservations that were taken in Redis but never reached
// Kafka (invariant 3), never one whose record Kafka holds (invariant 7), and
// rebuilds a sale's Redis stock when Redis lost it.
//
// A pending reservation older than After whose order row exists is
// confirmed (the writer stored it and stopped before confirming). One
// without a row is declared lost only when Kafka proves its record never
// reached the broker, read once per pass from the writer group's committed
// offsets (Config.Orders):
//
//   - with a recorded position (the publish was acknowledged: a 202), only
//     when the group has committed past it, so the writer has handled it
//     (a writer that is down or behind leaves it pending);
//   - without one (an uncertain publish, answered 503, or a position that
//     could not be kept), only when the group had consumed every partition
//     up to its end, read after the reservation's publish bound had passed;
//   - with Kafka unreachable, never.
//
// Declaring lost, in one transaction, inserts a REJECTED tombstone order row
// with the reservation's order id (ON CONFLICT (id) DO NOTHING) and, when
// the insert took, a stock_returns outbox row; after the commit the unit
// goes back in Redis and the outbox row is deleted. Several reconcilers may
// run at once: the primary key makes the tombstone once, and the release
// script gives a unit back once per order.
//
// Redis data loss: when a sale's stock record is missing in Redis (looked
// for every LossCheck), reservations of the sale answer 503 and, one lease
// TTL after the loss was seen (no reservation of the lost Redis is
// acknowledged later), the stock is rebuilt: remaining = quantity − live
// orders in PostgreSQL − orders in flight in Kafka (past the writer
// group's committed offsets, up to the end offsets read, without a row
// yet), with a buyer record for each, writing only fields that are
// missing; a record of the lost Redis that lands past those offsets is
// refused by the writer (a fence, rebuild.go). So no order acknowledged
// before the loss is refused by the database later, and no unit is
// counted both free and sold. A
// Redis that serves another dataset than before (restarted, or a replica
// promoted that may have missed the last writes, seen by its replication
// ID) keeps stale counts rather than none: every sale's stock and buyer
// records are then dropped and rebuilt the same way.
type Reconciler struct {
	after, interval, window time.Duration
	publish, lossCheck      time.Duration
	leaseTTL                time.Duration
	batch                   int64
	now                     func() time.Time
	store                   *orderstore.Store
	st                      *redisstock.Store
	sales                   SaleLister
	orders                  OrderLog
	log                     *slog.Logger

	// rebuildMu makes rebuildIfLost one at a time. lost holds the losses
	// this reconciler is rebuilding, by sale; incarnation is the Redis
	// dataset last seen (redisstock.Incarnation).
	rebuildMu   sync.Mutex
	lostMu      sync.Mutex
	lost        map[int64]*loss
	incarnation string

	// lapses are the lapsed leases being reclaimed (reclaim.go), by
	// slot; only the watchLeases goroutine touches them.
	lapses map[int]*lapse

	returned, confirmed, rebuilt, failures, held prometheus.Counter
	// stale is the number of reservations older than After that the last
	// pass left pending (no order row yet, Kafka may hold their record).
	stale prometheus.Gauge
}

// New returns a Reconciler. reg may be nil.
func New(cfg Config, pool *pgxpool.Pool, st *redisstock.Store, sales SaleLister, logger *slog.Logger, reg prometheus.Registerer) *Reconciler {
	if cfg.After <= 0 {
		cfg.After = DefaultAfter
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
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
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = redisstock.DefaultPublishTimeout
	}
	if cfg.LossCheck <= 0 {
		cfg.LossCheck = DefaultLossCheck
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	counter := func(name, help string) prometheus.Counter {
		c, err := prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "flashsale_purchase_reconciler_" + name, Help: help}))
		errs = append(errs, err)
		return c
	}
	r := &Reconciler{
		after: cfg.After, interval: cfg.Interval, window: cfg.PaymentWindow, batch: cfg.Batch, now: cfg.Now,
		publish: cfg.PublishTimeout, lossCheck: cfg.LossCheck, leaseTTL: cfg.LeaseTTL, lapses: map[int]*lapse{},
		store: orderstore.New(pool), st: st, sales: sales, orders: cfg.Orders, log: logger.With("component", "reconciler"),
		lost:      map[int64]*loss{},
		returned:  counter("returned_total", "Lost reservations whose unit went back to stock."),
		confirmed: counter("confirmed_total", "Stale reservations found stored in the database and confirmed."),
		rebuilt:   counter("rebuilt_items_total", "Item stock records rebuilt from the database after Redis lost them."),
		failures:  counter("errors_total", "Reconciler runs that ended with an error."),
		held:      counter("held_total", "Stale reservations without an order row left pending because Kafka may still hold their record."),
	}
	var err error
	r.stale, err = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "flashsale_purchase_reconciler_stale_pending",
		Help: "Reservations older than the reconcile bound (FLASHSALE_RECONCILE_AFTER) left pending in Redis by the last pass: not yet in PostgreSQL."}))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		r.log.Error("reconciler metrics not exported", "err", err)
	}
	return r
}

// Run reconciles every Interval, and looks for lost stock records every
// LossCheck, until ctx ends; it returns nil then.
func (r *Reconciler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.watchLoss(ctx) })
	if r.leaseTTL > 0 {
		wg.Go(func() { r.watchLeases(ctx) })
	}
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

// watchLoss rebuilds lost stock records every LossCheck until ctx ends.
func (r *Reconciler) watchLoss(ctx context.Context) {
	t := time.NewTicker(r.lossCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.checkIncarnation(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("Redis incarnation check failed", "err", err)
		}
		for _, sale := range r.sales.Sales() {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := r.rebuildIfLost(rctx, sale)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.failures.Inc()
				r.log.Warn("stock rebuild failed; retrying", "sale", sale.ID, "err", err)
			}
		}
	}
}

// kafkaTimeout bounds one question to Kafka, so that a broker that is away
// delays neither the reconcile pass nor the loss check for long.
const kafkaTimeout = 5 * time.Second

// kafkaView is one reading of the writer group's progress.
type kafkaView struct {
	ok             bool // Kafka answered (or there is no Kafka to ask)
	none           bool // no OrderLog configured
	at             time.Time
	committed, end map[int32]int64
}

// caughtUp reports whether the group had consumed every partition to its
// end: every record acknowledged before the reading is in the database.
func (v kafkaView) caughtUp() bool { return committedPast(v.committed, v.end) }

func (r *Reconciler) readKafka(ctx context.Context) kafkaView {
	if r.orders == nil {
		return kafkaView{ok: true, none: true}
	}
	at := r.now()
	kctx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	defer cancel()
	committed, end, err := r.orders.Progress(kctx)
	if err != nil {
		r.log.Warn("Kafka progress unknown; no reservation is declared lost this round", "err", err)
		return kafkaView{}
	}
	return kafkaView{ok: true, at: at, committed: committed, end: end}
}

// mayDeclareLost reports whether Kafka proves that p's record never reached
// the broker (or that the writer has handled it), so that p without an order
// row is lost.
func (r *Reconciler) mayDeclareLost(p redisstock.Pending, v kafkaView) bool {
	switch {
	case v.none:
		return true
	case !v.ok:
		return false
	case p.Placed:
		c, ok := v.committed[p.Partition]
		return ok && c > p.Offset
	default:
		return v.caughtUp() && p.ReservedAt.Add(redisstock.DefaultReserveTimeout+r.publish).Before(v.at)
	}
}

// RunOnce reconciles every sale once and reports how many units went back to
// stock.
func (r *Reconciler) RunOnce(ctx context.Context) (returned int, err error) {
	cutoff := r.now().Add(-r.after)
	view := r.readKafka(ctx)
	var errs []error
	var stale int64
	defer func() { r.stale.Set(float64(stale)) }()
	if err := r.checkIncarnation(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, sale := range r.sales.Sales() {
		if err := r.rebuildIfLost(ctx, sale); err != nil {
			errs = append(errs, fmt.Errorf("sale %d: %w", sale.ID, err))
			continue
		}
		n, err := r.reconcileSale(ctx, sale, cutoff, view, &stale)
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
		return returned, fmt.Errorf("reconcile.Reconciler.RunOnce: %w", err)
	}
	return returned, nil
}

func (r *Reconciler) reconcileSale(ctx context.Context, sale *flashsale.Sale, cutoff time.Time, view kafkaView, stale *int64) (int, error) {
	r.st.SetShards(sale.ID, sale.Shards())
	// A sharded sale's reservations cut short before the cutoff left
	// claims, loans or returns between shards: settle them first.
	returned, err := r.st.Sweep(ctx, sale.ID, cutoff)
	r.returned.Add(float64(returned))
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for shard := range r.st.Shards(sale.ID) {
		n, err := r.reconcileShard(ctx, sale, shard, cutoff, view, stale)
		returned += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return returned, errors.Join(errs...)
}

// reconcileShard settles the stale reservations of one shard of the sale
// and adds those it leaves pending to *stale.
func (r *Reconciler) reconcileShard(ctx context.Context, sale *flashsale.Sale, shard int, cutoff time.Time, view kafkaView, stale *int64) (int, error) {
	returned := 0
	var skip int64 // reservations left pending so far, oldest first
	for {
		ps, err := r.st.PendingBeforeFrom(ctx, sale.ID, shard, cutoff, skip, r.batch)
		if err != nil {
			return returned, err
		}
		var errs []error
		kept := 0
		for _, p := range ps {
			ok, stays, err := r.settle(ctx, sale, p, view)
			if err != nil {
				errs = append(errs, fmt.Errorf("order %s: %w", p.OrderID, err))
				continue
			}
			if stays {
				kept++
				*stale++
			}
			if ok {
				returned++
			}
		}
		// Every settled reservation left the pending set; the ones left
		// pending (the writer is behind) are skipped in the next read. On
		// errors, stop here rather than read the same failing ones again.
		if len(errs) > 0 || int64(len(ps)) < r.batch {
			return returned, errors.Join(errs...)
		}
		skip += int64(kept)
	}
}

// settle decides one stale reservation; it reports whether its unit went
// back to stock, and whether it stays pending (Kafka may hold its record).
func (r *Reconciler) settle(ctx context.Context, sale *flashsale.Sale, p redisstock.Pending, view kafkaView) (returned, stays bool, err error) {
	if _, err := uuid.Parse(p.OrderID); err != nil {
		// No order row can carry this id, so none exists: give it back.
		ok, err := r.st.Release(ctx, sale.ID, p.UserID, p.ItemID, p.OrderID)
		return ok, false, err
	}
	if !r.mayDeclareLost(p, view) {
		exists, owed, err := r.store.Exists(ctx, p.OrderID)
		if err != nil {
			return false, false, fmt.Errorf("order row: %w", err)
		}
		switch {
		case !exists:
			// The writer has not reached it yet: never lost.
			r.held.Inc()
			return false, true, nil
		case !owed:
			if err := r.st.Confirm(ctx, []redisstock.Pending{p}); err != nil {
				return false, false, err
			}
			r.confirmed.Inc()
			return false, false, nil
		}
		// The row exists and its unit is owed: finish the return below.
		ok, err := r.giveBack(ctx, sale, p)
		return ok, false, err
	}
	ok, err := r.declareLost(ctx, sale, p)
	return ok, false, err
}

// declareLost tombstones a reservation Kafka proved lost and gives its unit
// back; if its order row exists, it confirms instead (or finishes a return
// an outbox row still owes).
func (r *Reconciler) declareLost(ctx context.Context, sale *flashsale.Sale, p redisstock.Pending) (bool, error) {
	var price int64
	if it, ok := sale.Item(p.ItemID); ok {
		price = it.PriceCents
	}
	// The REJECTED row, its order.rejected event (the shop hears of an
	// order the shopper saw pending) and its stock return, in one
	// statement; nothing when the row exists.
	inserted, err := r.store.Tombstone(ctx, orderstore.Lost{
		OrderID: p.OrderID, SaleID: sale.ID, ItemID: p.ItemID, UserID: p.UserID, Price: price,
		ReservedAt: p.ReservedAt, ExpiresAt: p.ReservedAt.Add(r.window), Reason: RejectLost,
	}, r.now())
	if err != nil {
		return false, fmt.Errorf("tombstone: %w", err)
	}
	if !inserted {
		// The order is in the database. Its unit goes back only if an
		// outbox row says so (a tombstone or a rejection whose release
		// did not finish); otherwise the writer stored it and stopped
		// before confirming.
		_, owed, err := r.store.Exists(ctx, p.OrderID)
		if err != nil {
			return false, fmt.Errorf("outbox: %w", err)
		}
		if !owed {
			if err := r.st.Confirm(ctx, []redisstock.Pending{p}); err != nil {
				return false, err
			}
			r.confirmed.Inc()
			return false, nil
		}
	}
	return r.giveBack(ctx, sale, p)
}

// giveBack releases the unit of an order whose outbox row is committed,
// then deletes the outbox row.
func (r *Reconciler) giveBack(ctx context.Context, sale *flashsale.Sale, p redisstock.Pending) (bool, error) {
	// Redis only after the commit; the outbox row covers a crash here.
	ok, err := r.st.Release(ctx, sale.ID, p.UserID, p.ItemID, p.OrderID)
	if err != nil {
		return false, err
	}
	if p.Placed {
		if err := r.st.Confirm(ctx, []redisstock.Pending{p}); err != nil { // drops the kept position
			return ok, err
		}
	}
	if err := r.store.Returned(ctx, []string{p.OrderID}); err != nil {
		return ok, fmt.Errorf("outbox delete: %w", err)
	}
	if ok {
		r.returned.Inc()
	}
	return ok, nil
}

// checkIncarnation drops every sale's stock and buyer records when Redis
// serves another dataset than last seen (restarted, or a replica promoted
// that may have missed the last writes), so that rebuildIfLost rebuilds
// them from PostgreSQL and Kafka: a stale count would sell again units
// already acknowledged.
func (r *Reconciler) checkIncarnation(ctx context.Context) error {
	id, ok, err := r.st.Incarnation(ctx)
	if err != nil || !ok {
		return err
	}
	r.lostMu.Lock()
	prev := r.incarnation
	r.incarnation = id
	r.lostMu.Unlock()
	if prev == "" || prev == id {
		return nil
	}
	r.log.Warn("Redis serves another dataset (restarted or failed over); rebuilding every sale's stock", "was", prev, "now", id)
	var errs []error
	for _, sale := range r.sales.Sales() {
		if err := r.st.Drop(ctx, sale.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		// Look again next time.
		r.lostMu.Lock()
		r.incarnation = prev
		r.lostMu.Unlock()
		return fmt.Errorf("reconcile.Reconciler: drop after a Redis failover: %w", err)
	}
	return nil
}
