package orderstore

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
)

// changeEvent is the event of a guarded change (CTE chg, every column of
// the order), occurred at $3, typed after the status the change set.
var changeEvent = eventsSQL("chg", `'order.' || lower(chg.status)`, "$3", "n.status", "NULL", "NULL")

// paySQL is the guarded PENDING → PAID change and its order.paid event.
var paySQL = `WITH chg AS (
	UPDATE orders SET status = 'PAID', paid_at = $3, updated_at = now()
	WHERE id = $1 AND user_id = $2 AND status = 'PENDING' AND expires_at > $3
	RETURNING *),
ev AS (` + changeEvent + `)
SELECT ` + orderColumns + ` FROM chg`

// Pay marks the user's order PAID at now if it is PENDING and inside its
// window, with its order.paid event; ok is false when it is not (or not
// there).
func (s *Store) Pay(ctx context.Context, userID int64, id string, now time.Time) (o flashsale.Order, ok bool, err error) {
	return one(s.pool.QueryRow(ctx, paySQL, id, userID, now), now)
}

// cancelSQL is the guarded change PENDING → CANCELLED (EXPIRED when past
// the window), its event, the item's sold count and the stock return, in
// one statement.
var cancelSQL = `WITH chg AS (
	UPDATE orders
	SET status = CASE WHEN expires_at <= $3 THEN 'EXPIRED' ELSE 'CANCELLED' END, updated_at = now()
	WHERE id = $1 AND user_id = $2 AND status = 'PENDING'
	RETURNING *),
ev AS (` + changeEvent + `),
sold AS (UPDATE items SET sold = items.sold - 1 FROM chg WHERE items.id = chg.item_id),
ret AS (` + returnsSQL("chg", "$3") + `)
SELECT ` + orderColumns + ` FROM chg`

// Cancel cancels the user's PENDING order at now (EXPIRED when its window
// has passed), with its event, items.sold lowered and a stock_returns row;
// ok is false when the order was not PENDING (or not there). The caller
// gives the unit back in Redis after it returns, then calls Returned.
func (s *Store) Cancel(ctx context.Context, userID int64, id string, now time.Time) (o flashsale.Order, ok bool, err error) {
	return one(s.pool.QueryRow(ctx, cancelSQL, id, userID, now), now)
}

// Return is a unit owed back to Redis: a stock_returns row.
type Return struct {
	OrderID              string
	SaleID, ItemID, User int64
}

// expireSQL expires up to $2 orders due at $1 with their order.expired
// events and stock returns, in one statement, so an order a concurrent pay
// or cancel won (skipped, or no longer PENDING) gets neither.
var expireSQL = `WITH chg AS (
	UPDATE orders o SET status = 'EXPIRED', updated_at = now()
	FROM (SELECT id FROM orders WHERE status = 'PENDING' AND expires_at <= $1
	      ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
	WHERE o.id = d.id AND o.status = 'PENDING'
	RETURNING o.id, o.sale_id, o.item_id, o.user_id, o.price_cents),
ev AS (` + eventsSQL("chg", "'order.expired'", "$1", "'EXPIRED'", "NULL", "NULL") + `),
ret AS (` + returnsSQL("chg", "$1") + `)
SELECT id::text, sale_id, item_id, user_id FROM chg`

// Expire marks up to limit orders PENDING past their window at now EXPIRED,
// in one transaction with their events, stock returns and items.sold
// lowered per item (in item id order, so concurrent batches cannot
// deadlock on the item rows). Rows another transaction holds are skipped,
// so parallel workers split the work.
func (s *Store) Expire(ctx context.Context, now time.Time, limit int) ([]Return, error) {
	var out []Return
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, expireSQL, now, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Return, error) {
			var d Return
			err := r.Scan(&d.OrderID, &d.SaleID, &d.ItemID, &d.User)
			return d, err
		})
		if err != nil || len(out) == 0 {
			return err
		}
		perItem := map[int64]int{}
		for _, d := range out {
			perItem[d.ItemID]++
		}
		itemIDs := make([]int64, 0, len(perItem))
		for id := range perItem {
			itemIDs = append(itemIDs, id)
		}
		slices.Sort(itemIDs)
		b := &pgx.Batch{}
		for _, id := range itemIDs {
			b.Queue(`UPDATE items SET sold = sold - $2 WHERE id = $1`, id, perItem[id])
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Lost is a reservation declared lost, whose tombstone Tombstone writes.
type Lost struct {
	OrderID                       string
	SaleID, ItemID, UserID, Price int64
	ReservedAt, ExpiresAt         time.Time
	Reason                        string
}

// tombstoneSQL writes the REJECTED row of a lost reservation, its
// order.rejected event (occurred at $9) and its stock return, in one
// statement. A row that exists already is no change and gets neither.
var tombstoneSQL = `WITH ins AS (
	INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at, reject_reason)
	VALUES ($1, $2, $3, $4, 'REJECTED', $5, $6, $7, $8)
	ON CONFLICT (id) DO NOTHING
	RETURNING id, sale_id, item_id, user_id, price_cents, reject_reason),
ev AS (` + eventsSQL("ins", "'order.rejected'", "$9", "'REJECTED'", "NULL", "n.reject_reason") + `),
ret AS (` + returnsSQL("ins", "now()") + `)
SELECT count(*) FROM ins`

// Tombstone writes the REJECTED row of a lost reservation at now, with its
// event and stock return; inserted is false when the order has a row
// already (the writer stored it, or another reconciler got there first).
func (s *Store) Tombstone(ctx context.Context, l Lost, now time.Time) (inserted bool, err error) {
	var n int
	err = s.pool.QueryRow(ctx, tombstoneSQL, l.OrderID, l.SaleID, l.ItemID, l.UserID, l.Price,
		l.ReservedAt, l.ExpiresAt, l.Reason, now).Scan(&n)
	return n == 1, err
}
