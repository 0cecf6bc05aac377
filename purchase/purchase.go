// Package purchase is the reservation service: it takes one unit in Redis
// (internal/adapter/redisstock, one script call), publishes the order to Kafka with a
// bound, keeps a local sold-out flag per item so refused requests never reach
// Redis, and holds the gateway's placement lease (Leaser), which it asks on
// every reservation. What it leaves unsettled (reservations that never
// reached the database, those in flight under a lapsed lease, stock Redis
// lost) is the Reconciler's, in package reconcile, which shares no memory
// with it: the two meet in Redis, PostgreSQL and Kafka.
package purchase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/prom"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// Publisher sends an accepted order on its way to the database
// (*kafka.Producer). Publish must return within the context's deadline, or,
// for a publisher with a Bound method (boundedPublisher), within that
// bound.
//
// A nil error means the order is durably accepted. An error whose chain holds
// a value with an Uncertain() bool method reporting true means the order may
// still be delivered later (the producer gave up waiting while a request was
// in flight): the reservation is then left to the writer or the Reconciler.
// Any other error means the order was not and will not be delivered, and the
// reservation is given back at once.
type Publisher interface {
	Publish(ctx context.Context, o flashsale.OrderPlaced) error
}

// boundedPublisher is a Publisher that bounds every Publish by itself
// (*kafka.Producer): the Service then gives it no deadline of its own, so
// that a publish costs one timer, not one here and one there.
type boundedPublisher interface {
	Bound() time.Duration
}

// placingPublisher is a Publisher that also reports where Kafka acknowledged
// the record (*kafka.Producer). The Service keeps that position with the
// pending reservation, so the Reconciler knows the order is in Kafka and
// never declares it lost, however long the writer takes to reach it.
type placingPublisher interface {
	PublishAt(ctx context.Context, o flashsale.OrderPlaced) (partition int32, offset int64, err error)
}

// Config configures a Service. Zero fields take the defaults.
type Config struct {
	Now func() time.Time // nil: time.Now
	// SoldOutRecheck is how often Run looks whether flagged items got
	// stock back (default 500ms).
	SoldOutRecheck time.Duration
	// PublishTimeout bounds the publish of one order (default 5s, as
	// kafka.DefaultPublishTimeout).
	PublishTimeout time.Duration
	// RedisTimeout bounds one reservation script call (default 2s).
	RedisTimeout time.Duration
	// Lease is the gateway's placement lease (nil: none): reservations
	// are recorded under its slot, and one is acknowledged only while
	// that lease is valid (lease.go).
	Lease *Leaser
}

// Defaults of Config.
const (
	DefaultSoldOutRecheck = 500 * time.Millisecond
	// The publish and reservation bounds are redisstock's: the reconciler
	// counts on the same values when it reads a pending reservation.
	DefaultPublishTimeout = redisstock.DefaultPublishTimeout
	DefaultRedisTimeout   = redisstock.DefaultReserveTimeout
)

// Reservation outcomes, the values of the outcome label of
// flashsale_purchase_reservations_total.
const (
	OutcomeReserved         = "reserved"
	OutcomeSoldOutFlag      = "sold_out_flag" // answered by the local flag, no Redis
	OutcomeSoldOut          = "sold_out"
	OutcomeAlreadyPurchased = "already_purchased"
	OutcomeNotFound         = "not_found"
	OutcomeRedisError       = "redis_error"
	OutcomePublishFailed    = "publish_failed"    // given back at once
	OutcomePublishUncertain = "publish_uncertain" // left to the writer or the reconciler
	OutcomeStockMissing     = "stock_missing"     // Redis lost the stock record; answered 503 until the rebuild
	OutcomeNoHold           = "no_hold"           // queue order: no unit held for the shopper (Claim)
	OutcomeReserveUncertain = "reserve_uncertain" // Redis did not answer: settled when it does (settle.go)
	OutcomeUncertainNone    = "uncertain_none"    // settled: the uncertain reservation never ran
	OutcomeLeaseLost        = "lease_lost"        // published, but the lease it was made under lapsed: 503, left to the reconciler
	OutcomeLateWritten      = "late_written"      // an uncertain publish the broker wrote after the bound (settle.go)
	OutcomeLateFailed       = "late_failed"       // an uncertain publish the broker refused after the bound: given back (settle.go)
)

// placedQueue is how many acknowledged positions may wait for Run to write
// them into Redis; beyond it a position is dropped, and the Reconciler
// falls back on the writer group having consumed everything (slower, never
// wrong).
const placedQueue = 8192

var (
	errUnavailable = &flashsale.Error{Code: flashsale.CodeUnavailable, Message: "the shop is busy; nothing was reserved, try again shortly"}
	// errStockMissing answers a reservation for an item of a known sale
	// whose stock record Redis lost: the Reconciler rebuilds it within
	// seconds, so the sale is delayed, never sold out.
	errStockMissing = &flashsale.Error{Code: flashsale.CodeUnavailable, Message: "the shop is recovering; nothing was reserved, try again shortly"}
	errNoOrderID    = errors.New("no order id")
	// errLeaseLost: the order was published, but the lease it was made
	// under is no longer valid here, so the Reconciler may have settled
	// it; the shopper is told to look the order up (an uncertain outcome).
	errLeaseLost = &uncertainError{errors.New("the placement lease lapsed before the order was acknowledged")}
)

// Service reserves stock and publishes orders. It is safe for concurrent use.
type Service struct {
	now            func() time.Time
	recheck        time.Duration
	publishTimeout time.Duration
	redisTimeout   time.Duration
	lease          *Leaser
	st             *redisstock.Store
	pub            Publisher
	log            *slog.Logger

	// flags is an immutable map itemID → saleID of items seen sold out,
	// replaced whole on change (rare), read without locks (often).
	flags   atomic.Pointer[map[int64]int64]
	flagsMu sync.Mutex

	// placed carries the Kafka positions of acknowledged orders to Run,
	// which writes them beside the pending reservations.
	placed        chan redisstock.Placement
	placedDropped prometheus.Counter

	outcomes   map[string]prometheus.Counter
	publishDur prometheus.Observer

	// settle holds the reservations Redis did not answer (settle.go).
	settle settleSet
}

// New returns a Service. reg may be nil.
func New(cfg Config, st *redisstock.Store, pub Publisher, logger *slog.Logger, reg prometheus.Registerer) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SoldOutRecheck <= 0 {
		cfg.SoldOutRecheck = DefaultSoldOutRecheck
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.RedisTimeout <= 0 {
		cfg.RedisTimeout = DefaultRedisTimeout
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		now: cfg.Now, recheck: cfg.SoldOutRecheck, publishTimeout: cfg.PublishTimeout, redisTimeout: cfg.RedisTimeout,
		lease: cfg.Lease, st: st, pub: pub, log: logger.With("component", "purchase"),
		placed: make(chan redisstock.Placement, placedQueue),
	}
	empty := map[int64]int64{}
	s.flags.Store(&empty)
	// Several services on one registry (tests, dev mode) share the
	// collectors.
	var errs [3]error
	var reservations *prometheus.CounterVec
	reservations, errs[0] = prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_purchase_reservations_total",
		Help: "Purchase attempts that reached the purchase service, by outcome.",
	}, []string{"outcome"}))
	s.outcomes = map[string]prometheus.Counter{}
	for _, o := range []string{OutcomeReserved, OutcomeSoldOutFlag, OutcomeSoldOut, OutcomeAlreadyPurchased,
		OutcomeNotFound, OutcomeRedisError, OutcomePublishFailed, OutcomePublishUncertain, OutcomeStockMissing, OutcomeNoHold,
		OutcomeReserveUncertain, OutcomeUncertainNone, OutcomeLeaseLost, OutcomeLateWritten, OutcomeLateFailed} {
		s.outcomes[o] = reservations.WithLabelValues(o)
	}
	s.publishDur, errs[1] = prom.Register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "flashsale_purchase_publish_seconds",
		Help:    "Time from a reservation to its Kafka acknowledgement (or failure).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}))
	s.placedDropped, errs[2] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_purchase_placements_dropped_total",
		Help: "Kafka positions of acknowledged orders not kept in Redis (queue full or Redis error).",
	}))
	if err := errors.Join(errs[:]...); err != nil {
		s.log.Error("purchase metrics not exported", "err", err)
	}
	return s
}

// SoldOut reports whether the item was seen sold out and has not been seen
// with stock since. It reads a local flag: no I/O, no lock.
func (s *Service) SoldOut(itemID int64) bool {
	_, ok := (*s.flags.Load())[itemID]
	return ok
}

func (s *Service) setSoldOut(saleID, itemID int64) {
	if s.SoldOut(itemID) {
		return
	}
	s.flagsMu.Lock()
	defer s.flagsMu.Unlock()
	old := *s.flags.Load()
	m := make(map[int64]int64, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[itemID] = saleID
	s.flags.Store(&m)
}

func (s *Service) clearSoldOut(itemIDs []int64) {
	if len(itemIDs) == 0 {
		return
	}
	s.flagsMu.Lock()
	defer s.flagsMu.Unlock()
	old := *s.flags.Load()
	m := make(map[int64]int64, len(old))
	for k, v := range old {
		m[k] = v
	}
	for _, id := range itemIDs {
		delete(m, id)
	}
	s.flags.Store(&m)
}

// Reserve takes one unit of item for userID and publishes the order. It
// returns the new order's id, or a *flashsale.Error in the chain:
//
//   - SOLD_OUT: no stock (answered by the local flag without Redis once the
//     item was seen sold out);
//   - ALREADY_PURCHASED with OrderID: the user holds an order in this sale;
//   - UNAVAILABLE: Redis has no stock record for the item (Redis lost its
//     data; the Reconciler rebuilds it), nothing reserved, and the sold-out
//     flag is left alone;
//   - UNAVAILABLE: Redis or Kafka failed. When Kafka refused the order
//     the reservation was given back. When the outcome is unknown the
//     error's OrderID names the order: a publish not acknowledged reaches
//     the database or is returned by the Reconciler (and becomes REJECTED)
//     after its bound; a reservation Redis did not answer is settled when
//     Redis answers again (settle.go).
//
// Once the reservation is taken, a caller giving up (ctx cancelled) does not
// interrupt it: the publish runs to its own bound.
func (s *Service) Reserve(ctx context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64) (string, error) {
	if s.SoldOut(item.ID) {
		s.outcomes[OutcomeSoldOutFlag].Inc()
		return "", redisstock.ErrSoldOut()
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("purchase.Reserve: %w", err)
	}
	uid, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("purchase.Reserve: %w: %w", errNoOrderID, err)
	}
	orderID := uid.String()
	now := s.now()
	work := context.WithoutCancel(ctx)

	s.st.SetShards(sale.ID, sale.Shards())
	tk := s.lease.Ticket()
	if sale.Shards() > 1 {
		tk = Unleased() // recorded by no script (redisstock.ReserveAs)
	}
	rctx, cancel := context.WithTimeout(work, s.redisTimeout)
	err = s.st.ReserveAs(rctx, tk.Slot(), sale.ID, item.ID, userID, orderID, now)
	cancel()
	if err != nil {
		var fe *flashsale.Error
		if errors.As(err, &fe) {
			switch fe.Code {
			case flashsale.CodeSoldOut:
				// A sharded sale answers SOLD_OUT only once every shard
				// was seen empty, so the flag never hides a shard's units.
				s.setSoldOut(sale.ID, item.ID)
				s.outcomes[OutcomeSoldOut].Inc()
			case flashsale.CodeAlreadyPurchased:
				if id, ok, serr := s.settleRetry(ctx, sale, userID, err); ok {
					if errors.Is(serr, errTryAgain) {
						// Its order was refused and the unit given
						// back: this purchase reserves anew.
						return s.Reserve(ctx, sale, item, userID)
					}
					return id, serr
				}
				s.outcomes[OutcomeAlreadyPurchased].Inc()
			case flashsale.CodeUnavailable:
				// The user's purchase on a sharded sale is still looking
				// for a unit: nothing of this one was taken.
				s.outcomes[OutcomeRedisError].Inc()
			case flashsale.CodeNotFound:
				// The item belongs to the sale (the caller found it there),
				// so a missing stock record is lost data, not a bad id.
				s.outcomes[OutcomeStockMissing].Inc()
				// One domain error in the chain: the edge answers 503.
				return "", fmt.Errorf("purchase.Reserve: %w: no stock record for item %d", errStockMissing, item.ID)
			default:
				s.outcomes[OutcomeNotFound].Inc()
			}
			return "", err
		}
		// The script may have run, or may still run: settled once Redis
		// answers again (settle.go).
		return "", fmt.Errorf("purchase.Reserve: %w", s.uncertainReserve(&unsettled{
			sale: sale, item: item, userID: userID, orderID: orderID, at: now, ticket: tk}, err))
	}

	tk = tk.shown(time.Now())
	err = s.place(work, sale, item, userID, orderID, now, tk)
	if err == nil {
		return orderID, nil
	}
	if !uncertain(err) {
		s.release(work, sale.ID, userID, item.ID, orderID)
	} else {
		s.keepLate(&unsettled{sale: sale, item: item, userID: userID, orderID: orderID, at: now, ticket: tk}, err)
	}
	return "", fmt.Errorf("purchase.Reserve: %w", err)
}

// place publishes a reserved order to its bound and counts the outcome.
// Its error is UNAVAILABLE: with the order's id when the outcome is
// unknown (uncertain(err): the reservation is left to the writer or the
// Reconciler), without one when the order will never be delivered (the
// caller gives the reservation back). An order published after what it
// was reserved under (tk: a lease, or the lease's span without one) stopped
// holding here is unknown too: the Reconciler may have settled it already,
// or a Redis-loss rebuild fenced it off (Leaser.Holds).
func (s *Service) place(work context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64, orderID string, now time.Time, tk Ticket) error {
	msg := flashsale.OrderPlaced{
		OrderID: orderID, SaleID: sale.ID, ItemID: item.ID, UserID: userID,
		PriceCents: item.PriceCents, CreatedAtMs: now.UnixMilli(),
	}
	pctx, cancel := work, context.CancelFunc(nil)
	if b, ok := s.pub.(boundedPublisher); !ok || b.Bound() > s.publishTimeout {
		pctx, cancel = context.WithTimeout(work, s.publishTimeout)
	}
	start := time.Now()
	err := s.publish(pctx, msg)
	s.publishDur.Observe(time.Since(start).Seconds())
	if cancel != nil {
		cancel()
	}
	if err == nil && !s.lease.Holds(tk) {
		err = errLeaseLost
	}
	if err == nil {
		s.outcomes[OutcomeReserved].Inc()
		return nil
	}
	if uncertain(err) {
		outcome := OutcomePublishUncertain
		if errors.Is(err, errLeaseLost) {
			outcome = OutcomeLeaseLost
		}
		s.outcomes[outcome].Inc()
		return fmt.Errorf("%w: %w", &flashsale.Error{
			Code:    flashsale.CodeUnavailable,
			Message: "your order could not be confirmed yet; look for it in this sale shortly",
			OrderID: orderID,
		}, err)
	}
	s.outcomes[OutcomePublishFailed].Inc()
	return fmt.Errorf("%w: %w", errUnavailable, err)
}

// Claim buys the unit held for userID in a sale allocated in queue order
// (redisstock.Hold, made by the waiting room at the shopper's turn) and
// publishes the order. Its answers are Reserve's, except that:
//
//   - there is no SOLD_OUT: the unit was taken at the hold, so the local
//     sold-out flag is not read (a holder buys even when the item is sold
//     out for everyone else);
//   - NOT_ADMITTED: no unit is held for the user (never, or its window
//     ended and it went to the next in line);
//   - INVALID: the unit held is of another item;
//   - UNAVAILABLE without an order id: Redis did not answer (the claim is
//     settled when it does: published if it ran, the hold kept if not),
//     Kafka refused the order (the claim is undone: the unit is held
//     again for the rest of the window), or Redis lost the stock and the
//     holds with it (they are rebuilt after the stock).
func (s *Service) Claim(ctx context.Context, sale *flashsale.Sale, item flashsale.Item, userID int64) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("purchase.Claim: %w", err)
	}
	now := s.now()
	work := context.WithoutCancel(ctx)
	s.st.SetShards(sale.ID, sale.Shards())
	tk := s.lease.Ticket()
	rctx, cancel := context.WithTimeout(work, s.redisTimeout)
	orderID, until, err := s.st.ClaimAs(rctx, tk.Slot(), sale.ID, item.ID, userID, now)
	cancel()
	if err != nil {
		var fe *flashsale.Error
		if !errors.As(err, &fe) {
			// The claim may have run, or may still run (settle.go).
			return "", fmt.Errorf("purchase.Claim: %w", s.uncertainReserve(&unsettled{
				sale: sale, item: item, userID: userID, at: now, claim: true, ticket: tk}, err))
		}
		switch fe.Code {
		case flashsale.CodeAlreadyPurchased:
			if id, ok, serr := s.settleRetry(ctx, sale, userID, err); ok {
				if errors.Is(serr, errTryAgain) {
					// Its order was refused and the unit is held for
					// the user again: this purchase claims it.
					return s.Claim(ctx, sale, item, userID)
				}
				return id, serr
			}
			s.outcomes[OutcomeAlreadyPurchased].Inc()
		case flashsale.CodeNotAdmitted:
			if s.stockLost(work, sale, item) {
				// The holds went with the stock and come back with
				// it: the holder tries again after Retry-After, not
				// back in line.
				s.outcomes[OutcomeStockMissing].Inc()
				return "", fmt.Errorf("purchase.Claim: %w: no stock record for item %d", errStockMissing, item.ID)
			}
			s.outcomes[OutcomeNoHold].Inc()
		default:
			s.outcomes[OutcomeNotFound].Inc()
		}
		return "", err
	}
	// An earlier claim Redis did not answer never ran (this one did).
	s.settle.take(sale.ID, userID, "")
	tk = tk.shown(time.Now())
	err = s.place(work, sale, item, userID, orderID, now, tk)
	if err == nil {
		return orderID, nil
	}
	if !uncertain(err) {
		s.unclaim(work, sale.ID, userID, orderID, until)
	} else {
		s.keepLate(&unsettled{sale: sale, item: item, userID: userID, orderID: orderID, at: now, claim: true, until: until, ticket: tk}, err)
	}
	return "", fmt.Errorf("purchase.Claim: %w", err)
}

// stockLost reports whether Redis has no stock record for the item: lost
// with Redis's data, until the reconciler rebuilds it (a failed read
// reports false).
func (s *Service) stockLost(work context.Context, sale *flashsale.Sale, item flashsale.Item) bool {
	rctx, cancel := context.WithTimeout(work, s.redisTimeout)
	defer cancel()
	left, err := s.st.ItemsRemaining(rctx, sale.ID, []int64{item.ID})
	return err == nil && len(left) == 1 && left[0] < 0
}

// unclaim holds the unit of a claim whose order will never be delivered
// for the user again, until the end of the same window. A failure is
// logged: the claim stays pending, and the Reconciler gives the unit back.
func (s *Service) unclaim(ctx context.Context, saleID, userID int64, orderID string, until time.Time) {
	uctx, cancel := context.WithTimeout(ctx, s.redisTimeout)
	defer cancel()
	if _, err := s.st.Unclaim(uctx, saleID, userID, orderID, until); err != nil {
		s.log.Warn("could not hold a unit again after a failed publish", "order", orderID, "sale", saleID, "err", err)
	}
}

// publish sends msg and, when the publisher reports the record's position,
// queues it for Run to keep beside the pending reservation.
func (s *Service) publish(ctx context.Context, msg flashsale.OrderPlaced) error {
	pp, ok := s.pub.(placingPublisher)
	if !ok {
		return s.pub.Publish(ctx, msg)
	}
	part, off, err := pp.PublishAt(ctx, msg)
	if err != nil {
		return err
	}
	select {
	case s.placed <- redisstock.Placement{SaleID: msg.SaleID, UserID: msg.UserID, OrderID: msg.OrderID, Partition: part, Offset: off}:
	default:
		s.placedDropped.Inc()
	}
	return nil
}

// release gives back a reservation that will not go further. A failure is
// logged and left to the Reconciler (the reservation stays pending).
func (s *Service) release(ctx context.Context, saleID, userID, itemID int64, orderID string) {
	ctx, cancel := context.WithTimeout(ctx, s.redisTimeout)
	defer cancel()
	if _, err := s.st.Release(ctx, saleID, userID, itemID, orderID); err != nil {
		s.log.Warn("could not give a reservation back; the reconciler will", "order", orderID, "sale", saleID, "err", err)
	}
}

func uncertain(err error) bool {
	var u interface{ Uncertain() bool }
	return errors.As(err, &u) && u.Uncertain()
}

// Run clears sold-out flags of items whose stock came back (expiry, cancel,
// rejection), checking every SoldOutRecheck with one HMGET per sale, and
// writes the Kafka positions of acknowledged orders into Redis, and
// settles the reservations Redis did not answer (settle.go), until ctx
// ends. It returns nil on cancellation.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.keepPlacements(ctx) })
	wg.Go(func() { s.settleLoop(ctx) })
	t := time.NewTicker(s.recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.recheckSoldOut(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("sold-out recheck failed", "err", err)
		}
	}
}

// keepPlacements writes queued positions in pipelines of what is waiting,
// until ctx ends.
func (s *Service) keepPlacements(ctx context.Context) {
	batch := make([]redisstock.Placement, 0, 256)
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-s.placed:
			batch = append(batch[:0], p)
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case p := <-s.placed:
				batch = append(batch, p)
			default:
				break more
			}
		}
		rctx, cancel := context.WithTimeout(ctx, s.redisTimeout)
		err := s.st.RecordPlaced(rctx, batch)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.placedDropped.Add(float64(len(batch)))
			s.log.Warn("could not keep Kafka positions of acknowledged orders", "orders", len(batch), "err", err)
		}
	}
}

// recheckSoldOut clears the flags of items that have stock again. An item
// Redis has no record of (data loss, not yet rebuilt) stays flagged.
func (s *Service) recheckSoldOut(ctx context.Context) error {
	flags := *s.flags.Load()
	if len(flags) == 0 {
		return nil
	}
	bySale := map[int64][]int64{}
	for item, sale := range flags {
		bySale[sale] = append(bySale[sale], item)
	}
	var back []int64
	var errs []error
	for sale, items := range bySale {
		rctx, cancel := context.WithTimeout(ctx, s.redisTimeout)
		left, err := s.st.ItemsRemaining(rctx, sale, items)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i, n := range left {
			if n > 0 {
				back = append(back, items[i])
			}
		}
	}
	s.clearSoldOut(back)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("purchase.recheckSoldOut: %w", err)
	}
	return nil
}

// uncertainError is an outcome the Service itself cannot know (see
// errLeaseLost): the reservation is left as it is.
type uncertainError struct{ err error }

func (e *uncertainError) Error() string   { return e.err.Error() }
func (e *uncertainError) Unwrap() error   { return e.err }
func (e *uncertainError) Uncertain() bool { return true }
