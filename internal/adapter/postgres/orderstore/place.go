package orderstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Placed is an order the writer stores: a reservation as its Kafka record
// tells it, and where that record is in the orders topic (which a Fence
// reads).
type Placed struct {
	ID                                 uuid.UUID
	SaleID, ItemID, UserID, PriceCents int64
	CreatedAt, ExpiresAt               time.Time
	Partition                          int32
	Offset                             int64
}

// Refusals of Place that no PostgreSQL error names (the others are the
// database's own: unique, foreign-key and check violations).
var (
	// ErrSoldOut: an item would pass its quantity.
	ErrSoldOut = errors.New("orderstore: an item would be sold past its quantity")
	// ErrUnknownItem: an item is not in its order's sale.
	ErrUnknownItem = errors.New("orderstore: an item is not in its order's sale")
	// ErrFenced: an order is a lost Redis's reservation that the stock's
	// rebuild did not count (Fence).
	ErrFenced = errors.New("orderstore: an order was reserved by a lost Redis and not counted by the rebuild")
)

const insertOrdersSQL = `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
SELECT u.id, u.sale_id, u.item_id, u.user_id, 'PENDING', u.price, u.created, u.expires
FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::timestamptz[], $7::timestamptz[])
	AS u(id, sale_id, item_id, user_id, price, created, expires)
ON CONFLICT (id) DO NOTHING
RETURNING id, sale_id, item_id, user_id, price_cents, created_at`

// pendingEventsSQL is the order.pending event of every row the insert CTE
// "ins" wrote, so a redelivered order, not inserted again, gets none;
// occurredAt is the order's createdAt.
var pendingEventsSQL = eventsSQL("ins", "'order.pending'", "n.created_at", "'PENDING'", "NULL", "NULL")

// insertPendingSQL is the general path's insert: the orders and their
// events, returning the ids inserted.
var insertPendingSQL = `WITH ins AS (` + insertOrdersSQL + `),
ev AS (` + pendingEventsSQL + `)
SELECT id FROM ins`

// updateSoldSQL is one guarded update for every item of the batch (the
// arrays named by ids, sales and units): an item whose stock would go over
// its quantity, that is not in the order's sale, or one of whose orders a
// fence refuses (fenceGuardSQL, over the per-order arrays named by items,
// created, parts and offs) is not updated, which the caller sees as a
// missing id.
func updateSoldSQL(ids, sales, units, items, created, parts, offs string) string {
	return `UPDATE items AS i SET sold = i.sold + v.n
FROM unnest(` + ids + `::int8[], ` + sales + `::int8[], ` + units + `::int4[]) AS v(id, sale_id, n)
WHERE i.id = v.id AND i.sale_id = v.sale_id AND i.sold + v.n <= i.quantity
	AND ` + fenceGuardSQL(items, created, parts, offs) + `
RETURNING v.sale_id, v.id`
}

// generalUpdateSoldSQL is the general path's update: the items' counts
// ($1…$3, soldArgs), then the orders' items, creation times, partitions
// and offsets ($4…$7).
var generalUpdateSoldSQL = updateSoldSQL("$1", "$2", "$3", "$4", "$5", "$6", "$7")

// insertAllNewSQL is the usual batch as one statement: the insert, the
// orders' events and the guarded update (the items' counts $8…$10; its
// fence guard reads the insert's items $3 and creation times $6, and the
// partitions $13 and offsets $14) as data-modifying CTEs, and
// flashsale_all_or_nothing (migration 0002), which raises, rolling the
// whole statement back, unless every order was new ($11 rows) and every
// item updated ($12 items).
var insertAllNewSQL = `WITH ins AS (` + insertOrdersSQL + `),
ev AS (` + pendingEventsSQL + `),
upd AS (` + updateSoldSQL("$8", "$9", "$10", "$3", "$6", "$13", "$14") + `)
SELECT flashsale_all_or_nothing((SELECT count(*) FROM ins) = $11 AND (SELECT count(*) FROM upd) = $12)`

type itemKey struct{ sale, item int64 }

// columns are orders as the column arrays the batched inserts unnest, in
// the order of their parameters $1…$7.
type columns struct {
	ids                         []uuid.UUID
	sales, items, users, prices []int64
	created, expires            []time.Time
	parts                       []int32
	offs                        []int64
}

func newColumns(orders []Placed) *columns {
	n := len(orders)
	c := &columns{
		ids: make([]uuid.UUID, 0, n), sales: make([]int64, 0, n), items: make([]int64, 0, n),
		users: make([]int64, 0, n), prices: make([]int64, 0, n),
		created: make([]time.Time, 0, n), expires: make([]time.Time, 0, n),
		parts: make([]int32, 0, n), offs: make([]int64, 0, n),
	}
	for _, o := range orders {
		c.ids = append(c.ids, o.ID)
		c.sales = append(c.sales, o.SaleID)
		c.items = append(c.items, o.ItemID)
		c.users = append(c.users, o.UserID)
		c.prices = append(c.prices, o.PriceCents)
		c.created = append(c.created, o.CreatedAt)
		c.expires = append(c.expires, o.ExpiresAt)
		c.parts = append(c.parts, o.Partition)
		c.offs = append(c.offs, o.Offset)
	}
	return c
}

func (c *columns) args() []any {
	return []any{c.ids, c.sales, c.items, c.users, c.prices, c.created, c.expires}
}

// Place writes PENDING orders with their order.pending events and the
// items' sold counts, and reports which rows it inserted (the others
// existed already: redeliveries). oneTrip tells which path wrote them.
//
// The usual batch (every order new, every item within its quantity) is
// one statement committed on its own, one round trip: the items' rows are
// locked by the update only while the statement and its commit run, not
// across a wait for the caller's next message. Anything else (a redelivered
// order, an item over its quantity or not in its sale, any error) rolls
// back and takes the general path, a transaction that finds and reports
// it: the database's constraint violations as they are, ErrSoldOut and
// ErrUnknownItem. When the one statement's outcome is unknown (the
// connection failed under it), the general path finds the rows it wrote,
// if it did, as existing.
func (s *Store) Place(ctx context.Context, orders []Placed) (inserted []bool, oneTrip bool, err error) {
	cols := newColumns(orders)
	if inserted, ok := s.placeAllNew(ctx, orders, cols); ok {
		return inserted, true, nil
	}
	inserted, err = s.placeGeneral(ctx, orders, cols)
	return inserted, false, err
}

func (s *Store) placeAllNew(ctx context.Context, orders []Placed, cols *columns) (inserted []bool, ok bool) {
	counts := map[itemKey]int32{}
	for _, o := range orders {
		counts[itemKey{o.SaleID, o.ItemID}]++
	}
	keys, args := soldArgs(counts)
	args = append(append(cols.args(), args...), len(orders), len(keys), cols.parts, cols.offs)
	var all bool
	if err := s.pool.QueryRow(ctx, insertAllNewSQL, args...).Scan(&all); err != nil || !all {
		return nil, false
	}
	inserted = make([]bool, len(orders))
	for i := range inserted {
		inserted[i] = true
	}
	return inserted, true
}

func (s *Store) placeGeneral(ctx context.Context, orders []Placed, cols *columns) ([]bool, error) {
	n := len(orders)
	idx := make(map[uuid.UUID]int, n)
	for i, o := range orders {
		idx[o.ID] = i
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit; a failed rollback closes the connection

	inserted := make([]bool, n)
	counts := map[itemKey]int32{}
	rows, err := tx.Query(ctx, insertPendingSQL, cols.args()...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		i, ok := idx[id]
		if !ok {
			rows.Close()
			return nil, fmt.Errorf("insert returned unknown id %s", id)
		}
		inserted[i] = true
		counts[itemKey{orders[i].SaleID, orders[i].ItemID}]++
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	if len(counts) > 0 {
		keys, args := soldArgs(counts)
		rows, err := tx.Query(ctx, generalUpdateSoldSQL, append(args, cols.items, cols.created, cols.parts, cols.offs)...)
		if err != nil {
			return nil, err
		}
		updated := make(map[itemKey]bool, len(keys))
		for rows.Next() {
			var k itemKey
			if err := rows.Scan(&k.sale, &k.item); err != nil {
				rows.Close()
				return nil, err
			}
			updated[k] = true
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		for _, k := range keys {
			if !updated[k] {
				return nil, whyNotUpdated(ctx, tx, k, cols)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return inserted, nil
}

// soldArgs are the parameters of updateSoldSQL for counts (units per item),
// with the items in the order the update locks them: by id, so concurrent
// writers never deadlock.
func soldArgs(counts map[itemKey]int32) (keys []itemKey, args []any) {
	keys = make([]itemKey, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b itemKey) int { return cmp.Or(cmp.Compare(a.item, b.item), cmp.Compare(a.sale, b.sale)) })
	itemIDs, saleIDs, ns := make([]int64, len(keys)), make([]int64, len(keys)), make([]int32, len(keys))
	for i, k := range keys {
		itemIDs[i], saleIDs[i], ns[i] = k.item, k.sale, counts[k]
	}
	return keys, []any{itemIDs, saleIDs, ns}
}

// whyNotUpdated tells an item that is not in the order's sale from one an
// order of the batch (cols) is fenced off from, and those from an
// oversold item.
func whyNotUpdated(ctx context.Context, tx pgx.Tx, k itemKey, cols *columns) error {
	var fenced bool
	err := tx.QueryRow(ctx, `SELECT NOT `+fenceGuardSQL("$3", "$4", "$5", "$6")+` FROM items i WHERE i.id = $1 AND i.sale_id = $2`,
		k.item, k.sale, cols.items, cols.created, cols.parts, cols.offs).Scan(&fenced)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrUnknownItem
	case err != nil:
		return err
	case fenced:
		return ErrFenced
	}
	return ErrSoldOut
}

// Rejected is an order the writer refuses, with its reason.
type Rejected struct {
	Placed
	Reason string
}

// rejectSQL writes refused orders as REJECTED rows with their
// order.rejected events (occurred at $9) and their stock returns, in one
// statement. An order whose row exists already (a replay, or the
// reconciler's tombstone) is not rejected again and gets neither.
var rejectSQL = `WITH ins AS (
	INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at, reject_reason)
	SELECT u.id, u.sale_id, u.item_id, u.user_id, 'REJECTED', u.price, u.created, u.expires, u.reason
	FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::timestamptz[], $7::timestamptz[], $8::text[])
		AS u(id, sale_id, item_id, user_id, price, created, expires, reason)
	ON CONFLICT (id) DO NOTHING
	RETURNING id, sale_id, item_id, user_id, price_cents, reject_reason),
ev AS (` + eventsSQL("ins", "'order.rejected'", "$9::timestamptz", "'REJECTED'", "NULL", "n.reject_reason") + `),
ret AS (` + returnsSQL("ins", "now()") + `)
SELECT id FROM ins`

// Reject writes the refused orders at now and returns the ids written now
// (each with a stock_returns row); the others had a row already.
func (s *Store) Reject(ctx context.Context, rjs []Rejected, now time.Time) (map[uuid.UUID]bool, error) {
	if len(rjs) == 0 {
		return nil, nil
	}
	placed := make([]Placed, len(rjs))
	reasons := make([]string, len(rjs))
	for i, r := range rjs {
		placed[i], reasons[i] = r.Placed, r.Reason
	}
	rows, err := s.pool.Query(ctx, rejectSQL, append(newColumns(placed).args(), reasons, now)...)
	if err != nil {
		return nil, err
	}
	fresh := make(map[uuid.UUID]bool, len(rjs))
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		fresh[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return fresh, nil
}
