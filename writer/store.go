package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
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
	switch {
	case errors.Is(err, orderstore.ErrSoldOut):
		return &refusal{reason: ReasonSoldOut}
	case errors.Is(err, orderstore.ErrUnknownItem):
		return &refusal{reason: ReasonUnknownItem}
	case errors.Is(err, orderstore.ErrFenced):
		return &refusal{reason: ReasonLostWithRedis}
	}
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

// placed is the order as the order store writes it, with where its record
// is (a rebuild's fence reads it).
func (o *order) placed() orderstore.Placed {
	p := orderstore.Placed{ID: o.id, SaleID: o.msg.SaleID, ItemID: o.msg.ItemID, UserID: o.msg.UserID,
		PriceCents: o.msg.PriceCents, CreatedAt: o.created, ExpiresAt: o.expires}
	if o.rec != nil {
		p.Partition, p.Offset = o.rec.Partition, o.rec.Offset
	}
	return p
}

// insertBatch writes orders through the order store (orderstore.Store.Place:
// one statement for the usual batch, the general path's transaction for
// anything else) and reports which rows it inserted (the others existed
// already: redeliveries).
func (w *Writer) insertBatch(ctx context.Context, orders []*order) ([]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	placed := make([]orderstore.Placed, len(orders))
	for i, o := range orders {
		placed[i] = o.placed()
	}
	inserted, oneTrip, err := w.orders.Place(ctx, placed)
	if oneTrip {
		w.m.oneTrip.Inc()
	} else {
		w.m.general.Inc()
	}
	if err != nil {
		return nil, classify(err)
	}
	return inserted, nil
}

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
	rjs2 := make([]orderstore.Rejected, len(idx))
	for j, i := range idx {
		rjs2[j] = orderstore.Rejected{Placed: rjs[i].o.placed(), Reason: rjs[i].reason}
	}
	fresh, err := w.orders.Reject(ctx, rjs2, w.cfg.Now().UTC())
	if err != nil {
		return nil, classify(err)
	}
	return fresh, nil
}

// releaseRejected gives the rejected orders' units back in Redis (after the
// database commit) and deletes their outbox rows. A failure leaves the
// outbox row for the outbox drainer; the release script gives a unit back
// at most once per order, so the retry is harmless.
func (w *Writer) releaseRejected(ctx context.Context, res *result) {
	var done []string
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
		done = append(done, m.OrderID)
	}
	if len(done) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, w.cfg.TxTimeout)
	defer cancel()
	if err := w.orders.Returned(dctx, done); err != nil {
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
	reasons, err := w.orders.Unfinished(ctx, ids)
	if err != nil {
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
