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
	var ch actionChange
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
		ch, err = s.actTx(ctx, tx, id, a, now)
		return err
	})
	if err := actError(a.Kind, err); err != nil {
		return flashsale.Sale{}, err
	}
	s.afterAct(ctx, id, ch)
	return s.Get(ctx, id)
}

// actionChange is what one action changes: the sales columns it sets,
// its audit row and, for a stock addition, its outbox row. The zero
// value changes nothing.
type actionChange struct {
	set  string         // the columns it sets, with $3 on; "": only the version moves
	args []any          // the values of $3 on
	body map[string]any // the audit row's fields; nil: nothing changes
	// addID is the stock_adds row of a stock addition of units to itemID;
	// 0: none.
	addID, itemID, units int64
}

// changes reports whether the action changes the sale.
func (c actionChange) changes() bool { return c.body != nil }

// actTx is Act's transaction: it locks the sale's row and checks its
// version, decides (and, for a stock addition, writes) the change, bumps
// the version and writes the audit row. An action that changes nothing
// returns the zero change and writes nothing.
func (s *Store) actTx(ctx context.Context, tx pgx.Tx, id int64, a flashsale.SaleAction, now time.Time) (actionChange, error) {
	version, err := s.lockVersion(ctx, tx, id, a.IfVersion)
	if err != nil {
		return actionChange{}, err
	}
	var ch actionChange
	switch a.Kind {
	case flashsale.ActionStock:
		ch, err = addStock(ctx, tx, id, a.ItemID, a.Add)
	default:
		var ctl saleControls
		if ctl, err = readControls(ctx, tx, id); err == nil {
			ch, err = planControl(ctl, a, now)
		}
	}
	if err != nil || !ch.changes() {
		return actionChange{}, err
	}
	if err := bumpVersion(ctx, tx, id, version, ch.set, ch.args); err != nil {
		return actionChange{}, err
	}
	ch.body["saleId"] = id
	return ch, audit(ctx, tx, a.Actor, string(a.Kind), ch.body)
}

// saleControls are the columns of a sale the kill switch, the end and the
// message act on.
type saleControls struct {
	paused  bool
	endsAt  *time.Time
	message string
}

// readControls reads the sale's controls in tx, which holds the row's
// lock (lockVersion), so the decision taken on them stands until the
// commit.
func readControls(ctx context.Context, tx pgx.Tx, id int64) (saleControls, error) {
	var c saleControls
	err := tx.QueryRow(ctx, `SELECT paused, ends_at, message_text FROM sales WHERE id = $1`, id).Scan(&c.paused, &c.endsAt, &c.message)
	return c, err
}

// planControl decides what a pause, resume, end or message changes on a
// sale whose controls are c, at now: the zero change when the sale is
// already so (an action repeated is harmless). It writes nothing.
func planControl(c saleControls, a flashsale.SaleAction, now time.Time) (actionChange, error) {
	switch a.Kind {
	case flashsale.ActionPause, flashsale.ActionResume:
		want := a.Kind == flashsale.ActionPause
		if c.paused == want {
			return actionChange{}, nil
		}
		return actionChange{set: `paused = $3`, args: []any{want}, body: map[string]any{}}, nil
	case flashsale.ActionEnd:
		if c.endsAt != nil && !now.Before(*c.endsAt) {
			return actionChange{}, nil
		}
		return actionChange{set: `ends_at = $3`, args: []any{now}, body: map[string]any{"endsAt": now}}, nil
	case flashsale.ActionMessage:
		if a.Text == "" && c.message == "" {
			return actionChange{}, nil
		}
		at := &now
		if a.Text == "" {
			at = nil // cleared: no message, no time
		}
		return actionChange{set: `message_text = $3, message_at = $4`, args: []any{a.Text, at}, body: map[string]any{"text": a.Text}}, nil
	default:
		return actionChange{}, fmt.Errorf("unknown action %q", a.Kind)
	}
}

// addStock adds units to an item of the sale in tx: it raises
// items.quantity and writes the stock_adds row that carries the units to
// Redis after the commit. The item's row is locked FOR NO KEY UPDATE, as
// lockVersion locks the sale's. NOT_FOUND for an item not of this sale,
// INVALID for units out of 1 to MaxStockAdd or a quantity past an INT.
func addStock(ctx context.Context, tx pgx.Tx, saleID, itemID, units int64) (actionChange, error) {
	if units < 1 || units > flashsale.MaxStockAdd {
		return actionChange{}, flashsale.Invalid("add", "must be 1 to %d", flashsale.MaxStockAdd)
	}
	var quantity int64
	err := tx.QueryRow(ctx, `SELECT quantity FROM items WHERE id = $1 AND sale_id = $2 FOR NO KEY UPDATE`, itemID, saleID).Scan(&quantity)
	if errors.Is(err, pgx.ErrNoRows) {
		return actionChange{}, errNoItem
	}
	if err != nil {
		return actionChange{}, err
	}
	if quantity > maxQuantity-units {
		return actionChange{}, flashsale.Invalid("add", "the item's quantity would pass %d", int64(maxQuantity))
	}
	if _, err := tx.Exec(ctx, `UPDATE items SET quantity = quantity + $2 WHERE id = $1`, itemID, units); err != nil {
		return actionChange{}, err
	}
	ch := actionChange{itemID: itemID, units: units,
		body: map[string]any{"itemId": itemID, "add": units, "quantity": quantity + units}}
	if err := tx.QueryRow(ctx, `INSERT INTO stock_adds (sale_id, item_id, units) VALUES ($1, $2, $3) RETURNING id`,
		saleID, itemID, units).Scan(&ch.addID); err != nil {
		return actionChange{}, err
	}
	return ch, nil
}

// bumpVersion sets the columns set (with $3 on: args) of the sale's row
// in tx, its updated_at, and moves its version on from version.
// VERSION_CONFLICT when the row's version is no longer version.
func bumpVersion(ctx context.Context, tx pgx.Tx, id, version int64, set string, args []any) error {
	if set == "" {
		set = `updated_at = now()`
	} else {
		set += `, updated_at = now()`
	}
	tag, err := tx.Exec(ctx, `UPDATE sales SET `+set+`, version = version + 1 WHERE id = $1 AND version = $2`,
		append([]any{id, version}, args...)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errConflict
	}
	return nil
}

// actError is what Act answers for its transaction's error: nil for
// none; a refusal (NOT_FOUND, VERSION_CONFLICT, INVALID) as it is, its
// message the operator's to read; anything else wrapped with the
// operation and the action.
func actError(kind flashsale.ActionKind, err error) error {
	switch flashsale.ErrorCode(err) {
	case "":
		return nil
	case flashsale.CodeNotFound, flashsale.CodeVersionConflict, flashsale.CodeInvalid:
		return err
	default:
		return fmt.Errorf("sales.Act %s: %w", kind, err)
	}
}

// afterAct follows a committed change: a stock addition's units go to
// Redis, and every gateway hears of the new version. The units are the
// database's once committed and the outbox row makes sure they reach
// Redis: a failure here is AddPending's to retry (and log), and Act still
// answers a success, so that the operator does not add the units a
// second time.
func (s *Store) afterAct(ctx context.Context, id int64, ch actionChange) {
	if !ch.changes() {
		return
	}
	if ch.addID != 0 {
		_ = s.applyAdd(ctx, ch.addID, id, ch.itemID, ch.units)
	}
	s.announce(ctx, id)
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

// Touch bumps the sale's version in tx and writes the audit row of a
// change to what another package keeps about the sale (the access
// package's allowlist): the gateways reload what they cache of the sale
// when its version moves. NOT_FOUND for no sale, VERSION_CONFLICT when
// ifVersion (not 0) is not the sale's. Call Announce after the commit.
func (s *Store) Touch(ctx context.Context, tx pgx.Tx, id, ifVersion int64, actor, action string, body map[string]any) error {
	version, err := s.lockVersion(ctx, tx, id, ifVersion)
	if err != nil {
		return err
	}
	if err := bumpVersion(ctx, tx, id, version, "", nil); err != nil {
		return err
	}
	if body == nil {
		body = map[string]any{}
	}
	body["saleId"] = id
	return audit(ctx, tx, actor, action, body)
}

// Announce tells every gateway that the sale changed (best effort: the
// caches also refresh on a timer).
func (s *Store) Announce(ctx context.Context, id int64) { s.announce(ctx, id) }
