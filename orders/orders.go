// Package orders reads a shopper's orders and changes their status: pay,
// cancel, and the drainer of the stock-return outbox.
//
// Every status change goes through the order store
// (internal/adapter/postgres/orderstore), whose guarded UPDATE (... AND
// status = 'PENDING') makes a concurrent pay, cancel and expiry of one
// order resolve to exactly one winner. A change that gives stock back writes a stock_returns row in the
// same transaction; the unit goes back to Redis only after the commit, and the
// row is deleted after the release. A crash in between leaves the row for
// DrainReturns; the release script is idempotent per order, so a retry never
// gives a unit back twice.
package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// SaleLister lists the known sales (*sales.Cache). The service looks through
// them for an order that is in Redis but not yet in PostgreSQL.
type SaleLister interface {
	Sales() []*flashsale.Sale
}

// Config configures a Service.
type Config struct {
	// PaymentWindow is how long an order may stay unpaid
	// (FLASHSALE_PAYMENT_WINDOW). It only dates orders that are not in
	// PostgreSQL yet; a stored order carries its own expires_at. 0: 10m.
	PaymentWindow time.Duration
	// Now is the clock. nil: time.Now.
	Now func() time.Time
	// OpTimeout bounds each operation, including the wait for a pooled
	// connection (pgx waits forever otherwise). 0: 5s.
	OpTimeout time.Duration
}

// Service is the order service. It is safe for concurrent use.
type Service struct {
	window    time.Duration
	now       func() time.Time
	opTimeout time.Duration
	pool      *pgxpool.Pool
	store     *orderstore.Store
	stock     *redisstock.Store
	sales     SaleLister
	log       *slog.Logger
}

// New returns a Service. sales may be nil (then an order that is only in
// Redis is never found); logger may be nil.
func New(cfg Config, pool *pgxpool.Pool, st *redisstock.Store, sales SaleLister, logger *slog.Logger) *Service {
	if cfg.PaymentWindow <= 0 {
		cfg.PaymentWindow = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{
		window: cfg.PaymentWindow, now: cfg.Now, opTimeout: cfg.OpTimeout,
		pool: pool, store: orderstore.New(pool), stock: st, sales: sales,
		log: logger.With("component", "orders"),
	}
}

var (
	errNotFound    = &flashsale.Error{Code: flashsale.CodeNotFound, Message: "no such order"}
	errNoLive      = &flashsale.Error{Code: flashsale.CodeNotFound, Message: "you hold no order in this sale"}
	errBadID       = &flashsale.Error{Code: flashsale.CodeInvalid, Message: "orderId must be a UUID"}
	errExpired     = &flashsale.Error{Code: flashsale.CodeOrderExpired, Message: "the payment window of this order has passed"}
	errCancelled   = &flashsale.Error{Code: flashsale.CodeOrderCancelled, Message: "this order was cancelled"}
	errRejected    = &flashsale.Error{Code: flashsale.CodeOrderCancelled, Message: "this order was refused and its stock given back"}
	errPaid        = &flashsale.Error{Code: flashsale.CodeOrderPaid, Message: "a paid order cannot be cancelled"}
	errNotPayable  = &flashsale.Error{Code: flashsale.CodeNotPayableYet, Message: "this order is still being recorded; retry shortly"}
	errUnavailable = &flashsale.Error{Code: flashsale.CodeUnavailable, Message: "orders are unavailable; retry shortly"}
)

// ParseID checks that id is a UUID in its 36-character form and returns it
// in canonical (lower-case) form, or an INVALID error.
func ParseID(id string) (string, error) {
	if len(id) != 36 {
		return "", errBadID
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return "", errBadID
	}
	return u.String(), nil
}

// internal wraps a non-domain error with the operation; a database that
// cannot be reached or cannot answer in time (down, restarting, pool
// exhausted, slow) becomes UNAVAILABLE for the caller, which the edge
// answers 503 with Retry-After.
func internal(op string, err error) error {
	var fe *flashsale.Error
	if errors.As(err, &fe) {
		if fe == err {
			return err // a plain domain answer (NOT_FOUND, ORDER_PAID, ...)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || postgres.Unavailable(err) {
		return fmt.Errorf("%s: %w: %w", op, errUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// dbOrder reads the caller's order from PostgreSQL.
func (s *Service) dbOrder(ctx context.Context, userID int64, id string) (flashsale.Order, bool, error) {
	return s.store.Get(ctx, userID, id, s.now())
}

// find returns the caller's order from PostgreSQL, or else from the caller's
// Redis buyer records (inDB false, Payable false), or NOT_FOUND. While
// PostgreSQL is unreachable, an order Redis holds is answered from Redis
// (PENDING, not payable: Redis does not know whether a stored order was
// paid since, and nothing can be paid until the database is back); any
// other order is UNAVAILABLE, since only the database knows it.
func (s *Service) find(ctx context.Context, userID int64, id string) (o flashsale.Order, inDB bool, err error) {
	o, ok, dbErr := s.dbOrder(ctx, userID, id)
	if ok {
		return o, true, nil
	}
	if dbErr != nil && !postgres.Unavailable(dbErr) {
		return flashsale.Order{}, false, dbErr
	}
	if s.sales != nil {
		now := s.now()
		for _, sl := range s.sales.Sales() {
			if now.Before(sl.StartsAt.Add(-time.Minute)) {
				continue // not open yet: nobody holds a reservation
			}
			b, ok, err := s.stock.Buyer(ctx, sl.ID, userID)
			if err != nil {
				return flashsale.Order{}, false, fmt.Errorf("%w: %w", errUnavailable, err)
			}
			if !ok || !strings.EqualFold(b.OrderID, id) {
				continue
			}
			if dbErr == nil {
				// The writer may have stored it since the first look.
				o, ok, err := s.dbOrder(ctx, userID, id)
				if ok {
					return o, true, nil
				}
				if err != nil && !postgres.Unavailable(err) {
					return flashsale.Order{}, false, err
				}
			}
			o, err := s.redisOrder(ctx, sl, sl.ID, userID, b)
			return o, false, err
		}
	}
	if dbErr != nil {
		return flashsale.Order{}, false, fmt.Errorf("%w: %w", errUnavailable, dbErr)
	}
	return flashsale.Order{}, false, errNotFound
}

// redisOrder builds the view of an order that is in Redis only. sl may be
// nil (the price then comes from PostgreSQL).
func (s *Service) redisOrder(ctx context.Context, sl *flashsale.Sale, saleID, userID int64, b redisstock.Buyer) (flashsale.Order, error) {
	o := flashsale.Order{
		ID: strings.ToLower(b.OrderID), SaleID: saleID, ItemID: b.ItemID, UserID: userID,
		Status:    flashsale.OrderPending,
		CreatedAt: b.CreatedAt.UTC(), ExpiresAt: b.CreatedAt.Add(s.window).UTC(),
	}
	paid, err := s.stock.Paid(ctx, saleID, b.OrderID)
	if err != nil {
		return flashsale.Order{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	if paid {
		o.Status = flashsale.OrderPaid
	}
	if sl != nil {
		if it, ok := sl.Item(b.ItemID); ok {
			o.PriceCents = it.PriceCents
			return o, nil
		}
	}
	err = s.pool.QueryRow(ctx, `SELECT price_cents FROM items WHERE id = $1`, b.ItemID).Scan(&o.PriceCents)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return flashsale.Order{}, err
	}
	return o, nil
}

// Get returns the caller's order; NOT_FOUND when it is unknown or another
// user's. An order accepted in Redis but not yet in PostgreSQL is PENDING
// with Payable false. Payable is true only for a stored PENDING order inside
// its payment window. A stored PENDING order past its window that the expiry
// worker has not reached yet reads as PENDING, Payable false. While
// PostgreSQL is unreachable an order Redis holds reads as PENDING, Payable
// false (PAID once its payment was recorded, lua.PaidKey), and any other is
// UNAVAILABLE.
func (s *Service) Get(ctx context.Context, userID int64, orderID string) (flashsale.Order, error) {
	id, err := ParseID(orderID)
	if err != nil {
		return flashsale.Order{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	o, _, err := s.find(ctx, userID, id)
	if err != nil {
		return flashsale.Order{}, internal("orders.Get", err)
	}
	return o, nil
}

// BySale returns the caller's live order (PENDING or PAID) in the sale, from
// PostgreSQL or else from Redis (Payable false); NOT_FOUND when the caller
// holds none. While PostgreSQL is unreachable, Redis's buyer record alone
// answers.
func (s *Service) BySale(ctx context.Context, userID, saleID int64) (flashsale.Order, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	o, err := s.bySale(ctx, userID, saleID)
	if err != nil {
		return flashsale.Order{}, internal("orders.BySale", err)
	}
	return o, nil
}

func (s *Service) bySale(ctx context.Context, userID, saleID int64) (flashsale.Order, error) {
	o, ok, err := s.store.Live(ctx, userID, saleID, s.now())
	if ok {
		return o, nil
	}
	// While PostgreSQL is unreachable the Redis buyer record answers: it
	// is what a purchase checks, so "none" here is what a purchase would
	// find too.
	dbDown := postgres.Unavailable(err)
	if err != nil && !dbDown {
		return flashsale.Order{}, err
	}
	b, ok, err := s.stock.Buyer(ctx, saleID, userID)
	if err != nil {
		return flashsale.Order{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	if !ok {
		return flashsale.Order{}, errNoLive
	}
	id, err := ParseID(b.OrderID)
	if err != nil {
		return flashsale.Order{}, errNoLive // not one of ours
	}
	// A unit held for the shopper at their turn (queue order) is not an
	// order until they buy it: a shopper whose purchase answer was lost
	// and who finds no order buys again, and is served from the hold.
	if _, _, held, err := s.stock.Held(ctx, saleID, userID); err != nil {
		return flashsale.Order{}, fmt.Errorf("%w: %w", errUnavailable, err)
	} else if held {
		return flashsale.Order{}, errNoLive
	}
	if !dbDown {
		o, ok, err := s.dbOrder(ctx, userID, id)
		switch {
		case ok && o.Status.Live(): // stored since the first look
			return o, nil
		case ok:
			return flashsale.Order{}, errNoLive // ended; its unit is on its way back
		case err != nil && !postgres.Unavailable(err):
			return flashsale.Order{}, err
		}
	}
	var sl *flashsale.Sale
	if s.sales != nil {
		for _, x := range s.sales.Sales() {
			if x.ID == saleID {
				sl = x
				break
			}
		}
	}
	return s.redisOrder(ctx, sl, saleID, userID, b)
}

// Pay marks the caller's PENDING order PAID while it is inside its payment
// window. Paying a PAID order again answers the order (harmless). Errors:
// ORDER_EXPIRED (EXPIRED, or PENDING past its window), ORDER_CANCELLED
// (CANCELLED, and also REJECTED: the order is void and its stock was given
// back), NOT_PAYABLE_YET (accepted but not yet in PostgreSQL), NOT_FOUND,
// INVALID (malformed id), UNAVAILABLE (PostgreSQL unreachable).
func (s *Service) Pay(ctx context.Context, userID int64, orderID string) (flashsale.Order, error) {
	id, err := ParseID(orderID)
	if err != nil {
		return flashsale.Order{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	o, err := s.pay(ctx, userID, id)
	if err != nil {
		return flashsale.Order{}, internal("orders.Pay", err)
	}
	return o, nil
}

func (s *Service) pay(ctx context.Context, userID int64, id string) (flashsale.Order, error) {
	for attempt := 0; ; attempt++ {
		now := s.now()
		o, ok, err := s.store.Pay(ctx, userID, id, now)
		if err != nil {
			return flashsale.Order{}, err
		}
		if ok {
			// So that a read while PostgreSQL is unreachable still
			// answers PAID; the payment itself is in the database.
			if err := s.stock.MarkPaid(ctx, o.SaleID, o.ID, now); err != nil {
				s.log.Warn("paid marker not written in Redis", "order", o.ID, "err", err)
			}
			return o, nil
		}
		cur, inDB, err := s.find(ctx, userID, id)
		if err != nil {
			return flashsale.Order{}, err
		}
		switch cur.Status {
		case flashsale.OrderPaid:
			return cur, nil
		case flashsale.OrderExpired:
			return flashsale.Order{}, errExpired
		case flashsale.OrderCancelled:
			return flashsale.Order{}, errCancelled
		case flashsale.OrderRejected:
			return flashsale.Order{}, errRejected
		}
		// PENDING.
		if !inDB {
			return flashsale.Order{}, errNotPayable
		}
		if !s.now().Before(cur.ExpiresAt) {
			return flashsale.Order{}, errExpired
		}
		// Stored between the update and the read: try again.
		if attempt >= 2 {
			return flashsale.Order{}, errNotPayable
		}
	}
}

// Cancel cancels the caller's PENDING order and gives its unit back at once:
// in one transaction the status, items.sold - 1 and a stock_returns row;
// after the commit the Redis release and the deletion of the row (left for
// DrainReturns if Redis fails). Cancelling a CANCELLED order again answers the
// order (harmless). Errors: ORDER_PAID, ORDER_EXPIRED (EXPIRED; a PENDING
// order past its window is expired here, with its stock given back, and
// answers ORDER_EXPIRED too), ORDER_CANCELLED (REJECTED), NOT_PAYABLE_YET (not
// yet in PostgreSQL), NOT_FOUND, INVALID, UNAVAILABLE (PostgreSQL
// unreachable).
func (s *Service) Cancel(ctx context.Context, userID int64, orderID string) (flashsale.Order, error) {
	id, err := ParseID(orderID)
	if err != nil {
		return flashsale.Order{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	o, err := s.cancel(ctx, userID, id)
	if err != nil {
		return flashsale.Order{}, internal("orders.Cancel", err)
	}
	return o, nil
}

func (s *Service) cancel(ctx context.Context, userID int64, id string) (flashsale.Order, error) {
	for attempt := 0; ; attempt++ {
		o, ok, err := s.store.Cancel(ctx, userID, id, s.now())
		if err != nil {
			return flashsale.Order{}, err
		}
		if ok {
			s.returnStock(ctx, o)
			if o.Status == flashsale.OrderExpired {
				return flashsale.Order{}, errExpired
			}
			return o, nil
		}
		cur, inDB, err := s.find(ctx, userID, id)
		if err != nil {
			return flashsale.Order{}, err
		}
		switch cur.Status {
		case flashsale.OrderCancelled:
			return cur, nil
		case flashsale.OrderPaid:
			return flashsale.Order{}, errPaid
		case flashsale.OrderExpired:
			return flashsale.Order{}, errExpired
		case flashsale.OrderRejected:
			return flashsale.Order{}, errRejected
		}
		if !inDB {
			return flashsale.Order{}, errNotPayable
		}
		if attempt >= 2 { // stored between the update and the read: try again
			return flashsale.Order{}, errNotPayable
		}
	}
}

// returnStock releases a committed order's unit in Redis and deletes its
// outbox row. A failure is logged and left to DrainReturns: the order's
// change is committed, so the caller's request succeeded.
func (s *Service) returnStock(ctx context.Context, o flashsale.Order) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opTimeout)
	defer cancel()
	if _, err := s.stock.Release(ctx, o.SaleID, o.UserID, o.ItemID, o.ID); err != nil {
		s.log.Warn("stock release failed; left to the outbox drainer", "order", o.ID, "err", err)
		return
	}
	if err := s.store.Returned(ctx, []string{o.ID}); err != nil {
		s.log.Warn("outbox delete failed; the drainer will retry (harmless)", "order", o.ID, "err", err)
	}
}

// DrainReturns retries stock_returns rows created at least olderThan ago (by
// the injected clock), up to limit of them (0: 500): the Redis release, then
// the deletion of the row. Rows are taken FOR UPDATE SKIP LOCKED, so several
// drainers share the work. The release is idempotent per order, so a retry
// never gives a unit back twice. It returns the number of rows settled
// (deleted); on a Redis error it settles those done before and returns the
// error.
func (s *Service) DrainReturns(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if limit <= 0 {
		limit = 500
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	n, err := s.store.Drain(ctx, s.now().Add(-olderThan), limit, func(r orderstore.Return) error {
		_, err := s.stock.Release(ctx, r.SaleID, r.User, r.ItemID, r.OrderID)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("orders.DrainReturns: %w", err)
	}
	return n, nil
}
