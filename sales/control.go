package sales

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
)

var errNoItem = &flashsale.Error{Code: flashsale.CodeNotFound, Message: "no such item in this sale"}

// maxQuantity is the largest items.quantity (an INT column).
const maxQuantity = 1<<31 - 1

// Act applies an operator's action to a sale (the kill switch, a stock
// addition, a message to the queue) with its audit row, bumps the sale's
// version and announces it to every gateway. An action that changes
// nothing (pausing a paused sale, resuming an open one, ending an ended
// one, clearing no message) is harmless: the sale as it is, no new
// version, no audit row. NOT_FOUND for an unknown sale or item (an item
// of another sale is unknown here), VERSION_CONFLICT when a.IfVersion is
// set and not the sale's, INVALID for a quantity out of range; nothing
// changes on any refusal.
//
// A stock addition raises items.quantity and writes a stock_adds row in
// the same transaction; the units reach Redis after the commit (AddPending
// retries what did not).
func (s *Store) Act(ctx context.Context, id int64, a flashsale.SaleAction) (_ flashsale.Sale, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	now := s.now().UTC()
	var addID int64
	changed := false
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		version, err := s.lockVersion(ctx, tx, id, a.IfVersion)
		if err != nil {
			return err
		}
		var (
			paused  bool
			endsAt  *time.Time
			message string
		)
		if err := tx.QueryRow(ctx, `SELECT paused, ends_at, message_text FROM sales WHERE id = $1`, id).Scan(&paused, &endsAt, &message); err != nil {
			return err
		}
		body := map[string]any{"saleId": id}
		var set string
		args := []any{id, version}
		switch a.Kind {
		case flashsale.ActionPause, flashsale.ActionResume:
			want := a.Kind == flashsale.ActionPause
			if paused == want {
				return nil
			}
			set, args = `paused = $3`, append(args, want)
		case flashsale.ActionEnd:
			if endsAt != nil && !now.Before(*endsAt) {
				return nil
			}
			set, args = `ends_at = $3`, append(args, now)
			body["endsAt"] = now
		case flashsale.ActionMessage:
			if a.Text == "" && message == "" {
				return nil
			}
			at := &now
			if a.Text == "" {
				at = nil
			}
			set, args = `message_text = $3, message_at = $4`, append(args, a.Text, at)
			body["text"] = a.Text
		case flashsale.ActionStock:
			if a.Add < 1 || a.Add > flashsale.MaxStockAdd {
				return flashsale.Invalid("add", "must be 1 to %d", flashsale.MaxStockAdd)
			}
			var quantity int64
			err := tx.QueryRow(ctx, `SELECT quantity FROM items WHERE id = $1 AND sale_id = $2 FOR NO KEY UPDATE`, a.ItemID, id).Scan(&quantity)
			if errors.Is(err, pgx.ErrNoRows) {
				return errNoItem
			}
			if err != nil {
				return err
			}
			if quantity > maxQuantity-a.Add {
				return flashsale.Invalid("add", "the item's quantity would pass %d", int64(maxQuantity))
			}
			if _, err := tx.Exec(ctx, `UPDATE items SET quantity = quantity + $2 WHERE id = $1`, a.ItemID, a.Add); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `INSERT INTO stock_adds (sale_id, item_id, units) VALUES ($1, $2, $3) RETURNING id`,
				id, a.ItemID, a.Add).Scan(&addID); err != nil {
				return err
			}
			body["itemId"], body["add"], body["quantity"] = a.ItemID, a.Add, quantity+a.Add
		default:
			return fmt.Errorf("unknown action %q", a.Kind)
		}
		if set == "" {
			set = `updated_at = now()`
		} else {
			set += `, updated_at = now()`
		}
		tag, err := tx.Exec(ctx, `UPDATE sales SET `+set+`, version = version + 1 WHERE id = $1 AND version = $2`, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errConflict
		}
		changed = true
		return audit(ctx, tx, a.Actor, string(a.Kind), body)
	})
	switch flashsale.ErrorCode(err) {
	case "":
	case flashsale.CodeNotFound, flashsale.CodeVersionConflict, flashsale.CodeInvalid:
		return flashsale.Sale{}, err
	default:
		return flashsale.Sale{}, fmt.Errorf("sales.Act %s: %w", a.Kind, err)
	}
	if addID != 0 {
		// Committed: the units are the database's, and the outbox row
		// makes sure they reach Redis. A failure here is AddPending's to
		// retry (and log); the answer stays a success, so that the
		// operator does not add the units a second time.
		_ = s.applyAdd(ctx, addID, id, a.ItemID, a.Add)
	}
	if changed {
		s.announce(ctx, id)
	}
	return s.Get(ctx, id)
}

// applyAdd puts one stock addition's units into Redis and deletes its
// outbox row.
func (s *Store) applyAdd(ctx context.Context, addID, saleID, itemID, units int64) error {
	if err := s.stock.AddStock(ctx, saleID, addID, itemID, units); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `DELETE FROM stock_adds WHERE id = $1`, addID)
	return err
}

// AddPending retries the stock additions whose units have not all reached
// Redis (the process stopped, or Redis failed, after the commit). The
// expiry workers run it every second (expiry.StockAdds); two running it
// at once add nothing twice (AddStock's markers).
func (s *Store) AddPending(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT a.id, a.sale_id, a.item_id, a.units, s.stock_shards FROM stock_adds a JOIN sales s ON s.id = a.sale_id ORDER BY a.id LIMIT 100`)
	if err != nil {
		return fmt.Errorf("sales.AddPending: %w", err)
	}
	type add struct{ id, sale, item, units, shards int64 }
	adds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (add, error) {
		var a add
		return a, r.Scan(&a.id, &a.sale, &a.item, &a.units, &a.shards)
	})
	if err != nil {
		return fmt.Errorf("sales.AddPending: %w", err)
	}
	var errs []error
	for _, a := range adds {
		s.stock.SetShards(a.sale, int(a.shards))
		if err := s.applyAdd(ctx, a.id, a.sale, a.item, a.units); err != nil {
			errs = append(errs, err)
			continue
		}
		s.announce(ctx, a.sale)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sales.AddPending: %w", err)
	}
	return nil
}
