// Package orderstore is the one owner of an order's rows in PostgreSQL:
// every status change of an order is a named method of Store (Place, Pay,
// Cancel, Expire, Reject, Tombstone, and the shop's payments, paid or
// refused), and each writes the change, its event and any stock return in
// one statement or one transaction, from one SQL builder. No other
// package's code names the orders, stock_returns, payments or
// payment_signatures tables or writes the event outbox (order_events) in
// its SQL, but the load tool, which audits a run's orders from outside
// (layout_test.go, TestTableOwners).
//
// Every change is guarded (an UPDATE ... WHERE status = 'PENDING', an
// INSERT ... ON CONFLICT DO NOTHING), and its event is built from the rows
// the guarded statement returned (eventsSQL), so a change that did not
// happen writes no event. The event's row id is drawn before its body is
// built (flashsale_order_event_body, migration 0006), which carries it as
// eventId. A change that gives a unit back writes its stock_returns row
// (returnsSQL) in the same statement or transaction; the unit goes back to
// Redis only after the commit, by the caller, which then deletes the row
// (Returned). Rows whose release did not finish are drained by Drain.
//
// Two drainers empty the outboxes, not one, because they promise different
// things. Stock returns (here) and stock additions (sales.Store.AddPending)
// are Redis scripts that are idempotent per row: any number of drainers
// may run at once and share rows (FOR UPDATE SKIP LOCKED), in any order.
// Order events (events.Relay) go to Kafka exactly once and in order per
// order: one relay at a time, under an advisory lock, reading in id order
// and recording Kafka offsets with its marks. One drainer for both would
// either serialise the stock returns behind the relay's lock or give the
// events up to concurrent, unordered delivery.
package orderstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale"
)

// Store is the order store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// New returns the order store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// eventsSQL is the one builder of the event outbox's SQL: it inserts the
// event of every row of src, a data-modifying CTE (or a one-row SELECT)
// with the columns id, sale_id, item_id, user_id and price_cents. typ,
// occurred, status, payment and reason are SQL expressions over src's row
// (as src.* in the inner select, as n.* in the outer one).
func eventsSQL(src, typ, occurred, status, payment, reason string) string {
	return `INSERT INTO order_events (id, order_id, type, body)
SELECT n.eid, n.id, n.etype,
	flashsale_order_event_body(n.eid, n.etype, ` + occurred + `, n.id, n.sale_id, n.item_id, n.user_id, ` + status + `, n.price_cents, ` + payment + `, ` + reason + `)
FROM (SELECT nextval('order_events_id_seq') AS eid, ` + typ + ` AS etype, ` + src + `.* FROM ` + src + `) n`
}

// returnsSQL is the one place rows go into the stock-return outbox: one
// per row of src (columns id, sale_id, item_id, user_id), created at the
// SQL expression created.
func returnsSQL(src, created string) string {
	return `INSERT INTO stock_returns (order_id, sale_id, item_id, user_id, created_at)
SELECT id, sale_id, item_id, user_id, ` + created + ` FROM ` + src + `
ON CONFLICT (order_id) DO NOTHING`
}

// orderColumns are the columns scanOrder reads.
const orderColumns = `id::text, sale_id, item_id, user_id, status, price_cents, created_at, expires_at`

// scanOrder scans orderColumns; Payable is computed at now.
func scanOrder(row pgx.Row, now time.Time) (flashsale.Order, error) {
	var o flashsale.Order
	var status string
	if err := row.Scan(&o.ID, &o.SaleID, &o.ItemID, &o.UserID, &status, &o.PriceCents, &o.CreatedAt, &o.ExpiresAt); err != nil {
		return flashsale.Order{}, err
	}
	o.Status = flashsale.OrderStatus(status)
	o.CreatedAt = o.CreatedAt.UTC()
	o.ExpiresAt = o.ExpiresAt.UTC()
	o.Payable = o.Status == flashsale.OrderPending && now.Before(o.ExpiresAt)
	return o, nil
}

// one scans a single order: ok is false, with no error, when there is none.
func one(row pgx.Row, now time.Time) (flashsale.Order, bool, error) {
	o, err := scanOrder(row, now)
	if errors.Is(err, pgx.ErrNoRows) {
		return flashsale.Order{}, false, nil
	}
	if err != nil {
		return flashsale.Order{}, false, err
	}
	return o, true, nil
}

// Get reads the user's order id (Payable at now); ok is false when there is
// no such order of that user.
func (s *Store) Get(ctx context.Context, userID int64, id string, now time.Time) (o flashsale.Order, ok bool, err error) {
	return one(s.pool.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = $1 AND user_id = $2`, id, userID), now)
}

// Live reads the user's live order (PENDING or PAID) in the sale; ok is
// false when the user holds none.
func (s *Store) Live(ctx context.Context, userID, saleID int64, now time.Time) (o flashsale.Order, ok bool, err error) {
	return one(s.pool.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders
		WHERE sale_id = $1 AND user_id = $2 AND status IN ('PENDING', 'PAID')`, saleID, userID), now)
}

// Exists reports whether the order has a row, and whether its unit is still
// owed back to Redis (a stock_returns row).
func (s *Store) Exists(ctx context.Context, id string) (exists, owed bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1),
		EXISTS (SELECT 1 FROM stock_returns WHERE order_id = $1)`, id).Scan(&exists, &owed)
	return exists, owed, err
}

// ItemCounts are the order counts of a sale per item and status.
type ItemCounts map[int64]map[flashsale.OrderStatus]int64

// CountBySale counts the sale's orders per item and status.
func (s *Store) CountBySale(ctx context.Context, saleID int64) (ItemCounts, error) {
	rows, err := s.pool.Query(ctx, `SELECT item_id, status, count(*) FROM orders WHERE sale_id = $1 GROUP BY item_id, status`, saleID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := ItemCounts{}
	for rows.Next() {
		var item, n int64
		var status string
		if err := rows.Scan(&item, &status, &n); err != nil {
			return nil, err
		}
		if out[item] == nil {
			out[item] = map[flashsale.OrderStatus]int64{}
		}
		out[item][flashsale.OrderStatus(status)] = n
	}
	return out, rows.Err()
}
