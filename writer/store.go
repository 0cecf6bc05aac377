package writer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
)

// order is one decoded OrderPlaced message.
type order struct {
	msg     flashsale.OrderPlaced
	id      uuid.UUID
	created time.Time
	expires time.Time
	rec     *kgo.Record
}

var errInvalid = errors.New("invalid order message")

// decode parses and checks one message value.
func decode(b []byte, now func() time.Time, window time.Duration) (*order, error) {
	var o order
	if err := json.Unmarshal(b, &o.msg); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	m := &o.msg
	if len(m.OrderID) != 36 {
		return nil, fmt.Errorf("%w: orderId is not a UUID", errInvalid)
	}
	id, err := uuid.Parse(m.OrderID)
	if err != nil {
		return nil, fmt.Errorf("%w: orderId: %w", errInvalid, err)
	}
	o.id = id
	switch {
	case m.SaleID <= 0:
		return nil, fmt.Errorf("%w: saleId", errInvalid)
	case m.ItemID <= 0:
		return nil, fmt.Errorf("%w: itemId", errInvalid)
	case m.UserID <= 0:
		return nil, fmt.Errorf("%w: userId", errInvalid)
	case m.PriceCents < 0:
		return nil, fmt.Errorf("%w: priceCents", errInvalid)
	case m.CreatedAtMs < 0 || m.CreatedAtMs > 1<<47: // year ~6400
		return nil, fmt.Errorf("%w: createdAtMs", errInvalid)
	}
	if m.CreatedAtMs > 0 {
		o.created = time.UnixMilli(m.CreatedAtMs).UTC()
	} else {
		o.created = now().UTC()
	}
	o.expires = o.created.Add(window)
	return &o, nil
}

// deadLetterValue is the dead-letter record value: the OrderPlaced JSON plus
// "reason".
func deadLetterValue(m flashsale.OrderPlaced, reason string) []byte {
	b, _ := json.Marshal(struct {
		flashsale.OrderPlaced
		Reason string `json:"reason"`
	}{m, reason}) // cannot fail: plain fields
	return b
}

// refusal is the database refusing the data of a batch (as opposed to a
// transient failure): the batch is split to find the refused record.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string {
	if r.err == nil {
		return "database refused the batch: " + r.reason
	}
	return "database refused the batch: " + r.reason + ": " + r.err.Error()
}

func (r *refusal) Unwrap() error { return r.err }

// classify turns the database's refusals into *refusal; other errors
// (connection, timeout, deadlock) stay as they are and are retried.
func classify(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch {
	case pe.Code == "23505": // unique_violation: orders_one_live_per_user
		return &refusal{reason: ReasonAlreadyPurchased, err: err}
	case pe.Code == "23503": // foreign_key_violation: no such item or sale
		return &refusal{reason: ReasonUnknownItem, err: err}
	case pe.Code == "23514": // check_violation: sold <= quantity
		return &refusal{reason: ReasonSoldOut, err: err}
	case strings.HasPrefix(pe.Code, "22"): // data exception
		return &refusal{reason: ReasonInvalid, err: err}
	}
	return err
}

// rowless reports whether a refusal leaves no order row to write.
func rowless(reason string) bool { return reason == ReasonUnknownItem || reason == ReasonInvalid }

type rejection struct {
	o      *order
	reason string
	fresh  bool // this writer rejected it now (not a replay): release and dead-letter
	outbox bool // a stock_returns row was written for it
}

type result struct {
	written, duplicate []*order
	rejected           []rejection
}

// attempt runs fn until it succeeds, the database refuses the data, or stop
// ends (shutdown: give up, the batch is delivered again).
func (w *Writer) attempt(stop context.Context, op string, fn func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := fn()
		var rf *refusal
		if err == nil || errors.As(err, &rf) || stop.Err() != nil {
			return err
		}
		w.log.Warn("database write failed, retrying", "op", op, "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-stop.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// store writes orders, splitting on refusals until the refused records are
// isolated; they go to res.rejected.
func (w *Writer) store(stop, ctx context.Context, orders []*order, res *result) error {
	var inserted []bool
	err := w.attempt(stop, "insert batch", func() error {
		var err error
		inserted, err = w.insertBatch(ctx, orders)
		return err
	})
	if err == nil {
		for i, o := range orders {
			if inserted[i] {
				res.written = append(res.written, o)
			} else {
				res.duplicate = append(res.duplicate, o)
			}
		}
		return nil
	}
	var rf *refusal
	if !errors.As(err, &rf) {
		return err
	}
	if len(orders) == 1 {
		w.log.Warn("database refused an order", "order", orders[0].msg.OrderID, "sale", orders[0].msg.SaleID,
			"item", orders[0].msg.ItemID, "user", orders[0].msg.UserID, "reason", rf.reason)
		res.rejected = append(res.rejected, rejection{o: orders[0], reason: rf.reason})
		return nil
	}
	mid := len(orders) / 2
	if err := w.store(stop, ctx, orders[:mid], res); err != nil {
		return err
	}
	return w.store(stop, ctx, orders[mid:], res)
}

const insertOrdersSQL = `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
SELECT u.id, u.sale_id, u.item_id, u.user_id, 'PENDING', u.price, u.created, u.expires
FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::timestamptz[], $7::timestamptz[])
	AS u(id, sale_id, item_id, user_id, price, created, expires)
ON CONFLICT (id) DO NOTHING
RETURNING id, sale_id, item_id, user_id, price_cents, created_at`

// pendingEventsSQL is the order.pending event of every row the insert CTE
// "ins" wrote (migration 0006: the outbox and the body's one definition),
// so an order and its event commit together and a redelivered order, not
// inserted again, gets none. The row id is drawn before the body is built,
// which carries it as eventId; occurredAt is the order's createdAt.
const pendingEventsSQL = `INSERT INTO order_events (id, order_id, type, body)
SELECT n.eid, n.id, 'order.pending',
	flashsale_order_event_body(n.eid, 'order.pending', n.created_at, n.id, n.sale_id, n.item_id, n.user_id, 'PENDING', n.price_cents, NULL, NULL)
FROM (SELECT nextval('order_events_id_seq') AS eid, ins.* FROM ins) n`

// insertPendingSQL is the general path's insert: the orders and their
// events, returning the ids inserted.
const insertPendingSQL = `WITH ins AS (` + insertOrdersSQL + `),
ev AS (` + pendingEventsSQL + `)
SELECT id FROM ins`

// One guarded update for every item of the batch: an item whose stock
// would go over its quantity (or that is not in the order's sale) is not
// updated, which the caller sees as a missing id.
const updateSoldSQL = `UPDATE items AS i SET sold = i.sold + v.n
FROM unnest($1::int8[], $2::int8[], $3::int4[]) AS v(id, sale_id, n)
WHERE i.id = v.id AND i.sale_id = v.sale_id AND i.sold + v.n <= i.quantity
RETURNING v.sale_id, v.id`

type itemKey struct{ sale, item int64 }

// orderColumns are orders as the column arrays the batched inserts unnest,
// in the order of their parameters $1…$7.
type orderColumns struct {
	ids                         []uuid.UUID
	sales, items, users, prices []int64
	created, expires            []time.Time
}

func newOrderColumns(n int) *orderColumns {
	return &orderColumns{
		ids: make([]uuid.UUID, 0, n), sales: make([]int64, 0, n), items: make([]int64, 0, n),
		users: make([]int64, 0, n), prices: make([]int64, 0, n),
		created: make([]time.Time, 0, n), expires: make([]time.Time, 0, n),
	}
}

func (c *orderColumns) add(o *order) {
	c.ids = append(c.ids, o.id)
	c.sales = append(c.sales, o.msg.SaleID)
	c.items = append(c.items, o.msg.ItemID)
	c.users = append(c.users, o.msg.UserID)
	c.prices = append(c.prices, o.msg.PriceCents)
	c.created = append(c.created, o.created)
	c.expires = append(c.expires, o.expires)
}

func (c *orderColumns) args() []any {
	return []any{c.ids, c.sales, c.items, c.users, c.prices, c.created, c.expires}
}

// insertBatch writes orders in one transaction and reports which rows it
// inserted (the others existed already: redeliveries).
func (w *Writer) insertBatch(ctx context.Context, orders []*order) ([]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	n := len(orders)
	cols := newOrderColumns(n)
	for _, o := range orders {
		cols.add(o)
	}
	if inserted, ok := w.insertAllNew(ctx, orders, cols); ok {
		w.m.oneTrip.Inc()
		return inserted, nil
	}
	w.m.general.Inc()
	idx := make(map[uuid.UUID]int, n)
	for i, o := range orders {
		idx[o.id] = i
	}

	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit; a failed rollback closes the connection

	inserted := make([]bool, n)
	counts := map[itemKey]int32{}
	rows, err := tx.Query(ctx, insertPendingSQL, cols.args()...)
	if err != nil {
		return nil, classify(err)
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
		counts[itemKey{orders[i].msg.SaleID, orders[i].msg.ItemID}]++
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err)
	}

	if len(counts) > 0 {
		keys, args := soldArgs(counts)
		rows, err := tx.Query(ctx, updateSoldSQL, args...)
		if err != nil {
			return nil, classify(err)
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
			return nil, classify(err)
		}
		for _, k := range keys {
			if !updated[k] {
				return nil, w.whyNotUpdated(ctx, tx, k)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, classify(err)
	}
	return inserted, nil
}

// insertAllNewSQL is the usual batch as one statement: the insert, the
// orders' events and the guarded update (its parameters renumbered $8…$10)
// as data-modifying CTEs, and flashsale_all_or_nothing (migration 0002), which raises, rolling the
// whole statement back, unless every order was new ($11 rows) and every
// item updated ($12 items).
var insertAllNewSQL = `WITH ins AS (` + insertOrdersSQL + `),
ev AS (` + pendingEventsSQL + `),
upd AS (` + strings.NewReplacer("$1::", "$8::", "$2::", "$9::", "$3::", "$10::").Replace(updateSoldSQL) + `)
SELECT flashsale_all_or_nothing((SELECT count(*) FROM ins) = $11 AND (SELECT count(*) FROM upd) = $12)`

// insertAllNew is insertBatch's fast path (cols: the orders as columns) for
// the usual batch, every order new and every item within its quantity: one
// statement, committed on its own, one round trip. The items' rows are
// locked by the update only while the statement and its commit run, not
// across a wait for the writer's next message (with BEGIN and COMMIT sent
// apart, a second batch in flight would queue behind the first one's items
// until the writer, on a crowded machine, got round to sending its COMMIT).
// ok is false, with nothing written, for anything else (a redelivered
// order, an item over its quantity or not in its sale, any error): the
// caller then runs the general path, which finds and reports it. When the
// statement's outcome is unknown (the connection failed under it), the
// general path's insert finds the rows it wrote, if it did, as existing.
func (w *Writer) insertAllNew(ctx context.Context, orders []*order, cols *orderColumns) (inserted []bool, ok bool) {
	counts := map[itemKey]int32{}
	for _, o := range orders {
		counts[itemKey{o.msg.SaleID, o.msg.ItemID}]++
	}
	keys, args := soldArgs(counts)
	args = append(append(cols.args(), args...), len(orders), len(keys))
	var all bool
	if err := w.pool.QueryRow(ctx, insertAllNewSQL, args...).Scan(&all); err != nil || !all {
		return nil, false
	}
	inserted = make([]bool, len(orders))
	for i := range inserted {
		inserted[i] = true
	}
	return inserted, true
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

// whyNotUpdated tells an oversold item from an item that is not in the
// order's sale.
func (w *Writer) whyNotUpdated(ctx context.Context, tx pgx.Tx, k itemKey) error {
	var exists bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM items WHERE id = $1 AND sale_id = $2)`, k.item, k.sale).Scan(&exists)
	if err != nil {
		return err
	}
	if !exists {
		return &refusal{reason: ReasonUnknownItem}
	}
	return &refusal{reason: ReasonSoldOut}
}

// The refused orders become REJECTED rows plus their order.rejected events
// (occurred at $9, the writer's clock) and their stock_returns outbox rows,
// in one statement. An order whose row exists already (a replay, or the
// reconciler's tombstone) is not rejected again, and gets no event.
const insertRejectedSQL = `WITH ins AS (
	INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at, reject_reason)
	SELECT u.id, u.sale_id, u.item_id, u.user_id, 'REJECTED', u.price, u.created, u.expires, u.reason
	FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::timestamptz[], $7::timestamptz[], $8::text[])
		AS u(id, sale_id, item_id, user_id, price, created, expires, reason)
	ON CONFLICT (id) DO NOTHING
	RETURNING id, sale_id, item_id, user_id, price_cents, reject_reason),
ev AS (
	INSERT INTO order_events (id, order_id, type, body)
	SELECT n.eid, n.id, 'order.rejected',
		flashsale_order_event_body(n.eid, 'order.rejected', $9::timestamptz, n.id, n.sale_id, n.item_id, n.user_id, 'REJECTED', n.price_cents, NULL, n.reject_reason)
	FROM (SELECT nextval('order_events_id_seq') AS eid, ins.* FROM ins) n)
INSERT INTO stock_returns (order_id, sale_id, item_id, user_id)
SELECT id, sale_id, item_id, user_id FROM ins
ON CONFLICT (order_id) DO NOTHING
RETURNING order_id`

// reject writes the REJECTED rows of res.rejected. Rejections that cannot
// have a row (unknown item, invalid values) are only released and
// dead-lettered.
func (w *Writer) reject(stop, ctx context.Context, res *result) error {
	var rows []int
	for i := range res.rejected {
		if !rowless(res.rejected[i].reason) {
			rows = append(rows, i)
		}
	}
	var fresh map[uuid.UUID]bool
	err := w.attempt(stop, "write rejected orders", func() error {
		var err error
		fresh, err = w.insertRejected(ctx, res.rejected, rows)
		return err
	})
	var rf *refusal
	if errors.As(err, &rf) {
		// One of them cannot have a row at all: write them one by one.
		fresh = map[uuid.UUID]bool{}
		for _, i := range rows {
			var f map[uuid.UUID]bool
			err := w.attempt(stop, "write rejected order", func() error {
				var err error
				f, err = w.insertRejected(ctx, res.rejected, []int{i})
				return err
			})
			if errors.As(err, &rf) {
				res.rejected[i].reason = ReasonInvalid
				if rowless(rf.reason) {
					res.rejected[i].reason = rf.reason
				}
				continue
			}
			if err != nil {
				return err
			}
			for id := range f {
				fresh[id] = true
			}
		}
	} else if err != nil {
		return err
	}
	kept := res.rejected[:0]
	for _, rj := range res.rejected {
		switch {
		case rowless(rj.reason):
			rj.fresh = true
		case fresh[rj.o.id]:
			rj.fresh, rj.outbox = true, true
		default:
			// Its row existed: a replay or the reconciler got there first
			// and owns the stock return.
			res.duplicate = append(res.duplicate, rj.o)
			continue
		}
		kept = append(kept, rj)
	}
	res.rejected = kept
	return nil
}

// insertRejected writes the rejections at idx and returns the ids written
// now (with an outbox row).
func (w *Writer) insertRejected(ctx context.Context, rjs []rejection, idx []int) (map[uuid.UUID]bool, error) {
	if len(idx) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	n := len(idx)
	cols := newOrderColumns(n)
	reasons := make([]string, 0, n)
	for _, i := range idx {
		cols.add(rjs[i].o)
		reasons = append(reasons, rjs[i].reason)
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, insertRejectedSQL, append(cols.args(), reasons, w.cfg.Now().UTC())...)
	if err != nil {
		return nil, classify(err)
	}
	fresh := make(map[uuid.UUID]bool, n)
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		fresh[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, classify(err)
	}
	return fresh, nil
}

// releaseRejected gives the rejected orders' units back in Redis (after the
// database commit) and deletes their outbox rows. A failure leaves the
// outbox row for the outbox drainer; the release script gives a unit back
// at most once per order, so the retry is harmless.
func (w *Writer) releaseRejected(ctx context.Context, res *result) {
	var done []uuid.UUID
	for _, rj := range res.rejected {
		if !rj.outbox {
			// No row (the message names an item not in its sale): its
			// fields cannot be trusted to release the right unit; the
			// reconciler returns the reservation from its pending member.
			continue
		}
		m := rj.o.msg
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		released, err := w.stock.Release(rctx, m.SaleID, m.UserID, m.ItemID, m.OrderID)
		cancel()
		if err != nil {
			w.log.Warn("releasing a rejected order's unit failed; the outbox will retry", "order", m.OrderID, "err", err)
			continue
		}
		w.log.Info("rejected order", "order", m.OrderID, "sale", m.SaleID, "item", m.ItemID, "user", m.UserID,
			"reason", rj.reason, "unit_released", released)
		done = append(done, rj.o.id)
	}
	if len(done) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	if _, err := w.pool.Exec(dctx, `DELETE FROM stock_returns WHERE order_id = ANY($1::uuid[])`, done); err != nil {
		w.log.Warn("deleting stock_returns rows failed; the outbox drainer will release again (harmless)", "orders", len(done), "err", err)
	}
}

// adoptUnfinished takes over the rejections that a previous run committed
// but did not finish (it stopped before the Redis release): a replayed
// message whose order is REJECTED and still has its stock_returns row is
// released, cleaned up and dead-lettered now. A failure here is only logged:
// the outbox drainer finishes the job.
func (w *Writer) adoptUnfinished(ctx context.Context, res *result) {
	if len(res.duplicate) == 0 {
		return
	}
	mine := make(map[uuid.UUID]bool, len(res.rejected))
	for _, rj := range res.rejected {
		mine[rj.o.id] = true // rejected in this batch: a copy of it is a plain duplicate
	}
	ids := make([]uuid.UUID, 0, len(res.duplicate))
	for _, o := range res.duplicate {
		if !mine[o.id] {
			ids = append(ids, o.id)
		}
	}
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT s.order_id, coalesce(o.reject_reason, '')
		FROM stock_returns s JOIN orders o ON o.id = s.order_id
		WHERE s.order_id = ANY($1::uuid[]) AND o.status = 'REJECTED'`, ids)
	if err != nil {
		w.log.Warn("looking for unfinished rejections failed", "err", err)
		return
	}
	reasons := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var reason string
		if err := rows.Scan(&id, &reason); err != nil {
			rows.Close()
			w.log.Warn("looking for unfinished rejections failed", "err", err)
			return
		}
		reasons[id] = reason
	}
	if err := rows.Err(); err != nil {
		w.log.Warn("looking for unfinished rejections failed", "err", err)
		return
	}
	if len(reasons) == 0 {
		return
	}
	kept := res.duplicate[:0]
	for _, o := range res.duplicate {
		if reason, ok := reasons[o.id]; ok && !mine[o.id] {
			delete(reasons, o.id) // once, even if the message came twice
			res.rejected = append(res.rejected, rejection{o: o, reason: reason, fresh: true, outbox: true})
			continue
		}
		kept = append(kept, o)
	}
	res.duplicate = kept
}
