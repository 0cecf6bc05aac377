package orderstore

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Returned deletes the stock_returns rows of orders whose unit went back to
// Redis.
func (s *Store) Returned(ctx context.Context, orderIDs []string) error {
	if len(orderIDs) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, `DELETE FROM stock_returns WHERE order_id = ANY($1::uuid[])`, orderIDs)
	return err
}

// Drain hands release the stock_returns rows created at or before before,
// oldest first, up to limit of them, and deletes the rows it released,
// in one transaction. Rows are taken FOR UPDATE SKIP LOCKED, so several
// drainers share the work. A release error stops the round: the rows
// released before it are deleted, and Drain returns their number and that
// error.
func (s *Store) Drain(ctx context.Context, before time.Time, limit int, release func(Return) error) (int, error) {
	var done []string
	var relErr error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT order_id::text, sale_id, item_id, user_id FROM stock_returns
			WHERE created_at <= $1 ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED`, before, limit)
		if err != nil {
			return err
		}
		rets, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Return, error) {
			var x Return
			err := r.Scan(&x.OrderID, &x.SaleID, &x.ItemID, &x.User)
			return x, err
		})
		if err != nil {
			return err
		}
		for _, r := range rets {
			if err := release(r); err != nil {
				relErr = err
				break
			}
			done = append(done, r.OrderID)
		}
		if len(done) == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, `DELETE FROM stock_returns WHERE order_id = ANY($1::uuid[])`, done)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(done), relErr
}

// Backlog is the number of stock_returns rows and the age of the oldest in
// seconds, by the database's clock, which stamped them (0: none).
func (s *Store) Backlog(ctx context.Context) (n int64, oldest float64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
		FROM stock_returns`).Scan(&n, &oldest)
	return n, oldest, err
}

// Unfinished returns, of ids, the REJECTED orders whose stock return is
// still owed (a rejection committed whose release did not finish), with
// their reject reasons.
func (s *Store) Unfinished(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT s.order_id, coalesce(o.reject_reason, '')
		FROM stock_returns s JOIN orders o ON o.id = s.order_id
		WHERE s.order_id = ANY($1::uuid[]) AND o.status = 'REJECTED'`, ids)
	if err != nil {
		return nil, err
	}
	reasons := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var reason string
		if err := rows.Scan(&id, &reason); err != nil {
			rows.Close()
			return nil, err
		}
		reasons[id] = reason
	}
	return reasons, rows.Err()
}

// Snapshot is what a Redis rebuild counts from, read in one snapshot:
// each item's quantity less the stock additions still in their outbox
// (they are added onto the rebuilt record afterwards), the sale's live
// orders, and which of the in-flight order ids have a row already (live or
// not: a REJECTED, EXPIRED or CANCELLED one holds no unit).
type Snapshot struct {
	Quantity map[int64]int64
	Live     []LiveOrder
	Stored   map[string]bool
	// Fences are the items' fences (AddFence), by item.
	Fences map[int64][]Fence
}

// LiveOrder is a PENDING or PAID order as a rebuild needs it.
type LiveOrder struct {
	ID             string
	ItemID, UserID int64
	CreatedAt      time.Time
}

// ReadSnapshot reads the sale's Snapshot; inflight are the order ids the
// orders topic holds past the writer's committed offsets.
func (s *Store) ReadSnapshot(ctx context.Context, saleID int64, inflight []string) (Snapshot, error) {
	snap := Snapshot{Quantity: map[int64]int64{}, Stored: map[string]bool{}, Fences: map[int64][]Fence{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT i.id, i.quantity - coalesce((SELECT sum(a.units) FROM stock_adds a WHERE a.item_id = i.id), 0),
			i.stock_fences FROM items i WHERE i.sale_id = $1`, saleID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id, q int64
			var fences []Fence
			if err := rows.Scan(&id, &q, &fences); err != nil {
				return err
			}
			snap.Quantity[id] = q
			if len(fences) > 0 {
				snap.Fences[id] = fences
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT id::text, item_id, user_id, created_at FROM orders
			WHERE sale_id = $1 AND status IN ('PENDING', 'PAID')`, saleID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var o LiveOrder
			if err := rows.Scan(&o.ID, &o.ItemID, &o.UserID, &o.CreatedAt); err != nil {
				return err
			}
			snap.Live = append(snap.Live, o)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(inflight) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, `SELECT id::text FROM orders WHERE id = ANY($1::uuid[])`, inflight)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			snap.Stored[id] = true
		}
		return rows.Err()
	})
	return snap, err
}
