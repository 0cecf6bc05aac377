package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// The Redis-loss rebuild. rebuildIfLost runs its steps in order; each
// step is a function of its own so that each rule is tested alone:
//
//  1. missingItems: which items of the sale have no stock record;
//  2. noteLoss: when the loss was first seen (the publishes in flight
//     then get their bound before anything is counted);
//  3. dropShards: on the first sighting, a sharded sale loses every shard,
//     not only the ones its node lost;
//  4. inflightOrders: the sale's orders Kafka holds past the writer's
//     committed offsets, read before PostgreSQL;
//  5. countRebuild: from the database's snapshot and those orders, each
//     missing item's remaining units and every live buyer's record;
//  6. restore: the records written back, only the fields Redis lacks.

// rebuildIfLost rebuilds the sale's Redis stock and buyer records when
// Redis has no stock record for some of its items, from PostgreSQL's live
// orders and the orders still in flight in Kafka. It waits PublishTimeout
// after the loss was first seen, so that the records of reservations taken
// before the loss are in Kafka when it reads; until then, and while Kafka
// cannot be read, the sale's reservations answer 503.
func (r *Reconciler) rebuildIfLost(ctx context.Context, sale *flashsale.Sale) error {
	if len(sale.Items) == 0 {
		return nil
	}
	r.st.SetShards(sale.ID, sale.Shards())
	missing, err := r.missingItems(ctx, sale)
	if err != nil {
		return err
	}
	now := r.now()
	seen, first := r.noteLoss(sale.ID, now, len(missing) > 0)
	if len(missing) == 0 {
		return nil
	}
	if first {
		r.log.Warn("Redis lost the sale's stock; rebuilding once publishes in flight have settled", "sale", sale.ID, "items", len(missing), "wait", r.publish)
		if err := r.dropShards(ctx, sale, missing); err != nil {
			return err
		}
	}
	if now.Before(seen.Add(r.publish)) {
		return nil
	}
	// Kafka before PostgreSQL: an order the writer stores between the two
	// reads is then found in the database, never missed by both.
	inflight, err := r.inflightOrders(ctx, sale)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	ids := make([]string, len(inflight))
	for i, o := range inflight {
		ids[i] = o.OrderID
	}
	// One snapshot of items, live orders and which in-flight orders have
	// a row already.
	snap, err := r.store.ReadSnapshot(ctx, sale.ID, ids)
	if err != nil {
		return fmt.Errorf("rebuild: read database: %w", err)
	}
	return r.restore(ctx, sale, countRebuild(snap, inflight, missing))
}

// missingItems returns the items of the sale that Redis has no stock
// record for (none when every record is there).
func (r *Reconciler) missingItems(ctx context.Context, sale *flashsale.Sale) (map[int64]bool, error) {
	ids := make([]int64, len(sale.Items))
	for i, it := range sale.Items {
		ids[i] = it.ID
	}
	left, err := r.st.ItemsRemaining(ctx, sale.ID, ids)
	if err != nil {
		return nil, err
	}
	missing := map[int64]bool{}
	for i, n := range left {
		if n < 0 {
			missing[ids[i]] = true
		}
	}
	return missing, nil
}

// noteLoss records whether the sale's stock is lost, as seen at now. While
// it is, it returns when the loss was first seen and whether that is now
// (first); a sale whose records are all there is forgotten, so that a later
// loss waits its own bound.
func (r *Reconciler) noteLoss(saleID int64, now time.Time, lost bool) (seen time.Time, first bool) {
	r.lostMu.Lock()
	defer r.lostMu.Unlock()
	if !lost {
		delete(r.lost, saleID)
		return time.Time{}, false
	}
	seen, ok := r.lost[saleID]
	if ok {
		return seen, false
	}
	r.lost[saleID] = now
	return now, true
}

// dropShards, for a sharded sale, drops every shard's records and marks
// every item missing. A node lost some shards of the sale only; the
// database knows how many units remain, not on which shard, and the shards
// still there keep selling: dropping them all makes the whole sale stand
// still until it is rebuilt from exact counts, as one shard would after
// losing its node. On failure the loss is forgotten, so the next check
// sees it first again and drops again.
func (r *Reconciler) dropShards(ctx context.Context, sale *flashsale.Sale, missing map[int64]bool) error {
	if r.st.Shards(sale.ID) <= 1 {
		return nil
	}
	if err := r.st.Drop(ctx, sale.ID); err != nil {
		r.lostMu.Lock()
		delete(r.lost, sale.ID)
		r.lostMu.Unlock()
		return fmt.Errorf("drop the sale's shards: %w", err)
	}
	for _, it := range sale.Items {
		missing[it.ID] = true
	}
	return nil
}

// inflightOrders returns the sale's orders in the orders topic past the
// writer group's committed offsets, each once, leaving out those the
// writer will dead-letter (an order id no row can carry, an item not in
// the sale). None without an OrderLog.
func (r *Reconciler) inflightOrders(ctx context.Context, sale *flashsale.Sale) ([]flashsale.OrderPlaced, error) {
	if r.orders == nil {
		return nil, nil
	}
	kctx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	committed, end, err := r.orders.Progress(kctx)
	cancel()
	if err != nil {
		return nil, err
	}
	// Reading the backlog may take longer than one question.
	all, err := r.orders.Unconsumed(ctx, committed, end)
	if err != nil {
		return nil, err
	}
	var inflight []flashsale.OrderPlaced
	seen := map[string]bool{}
	for _, o := range all {
		if o.SaleID != sale.ID || seen[o.OrderID] {
			continue
		}
		if _, err := uuid.Parse(o.OrderID); err != nil {
			continue // the writer dead-letters it
		}
		if _, ok := sale.Item(o.ItemID); !ok {
			continue
		}
		seen[o.OrderID] = true
		inflight = append(inflight, o)
	}
	return inflight, nil
}

// rebuildCounts is what a rebuild writes back: each missing item's remaining
// units and the buyer record of every user holding a live order, and how
// many of those orders were found in Kafka only.
type rebuildCounts struct {
	remaining map[int64]int64
	buyers    map[int64]redisstock.Buyer
	fromKafka int
}

// countRebuild counts the rebuild from the database's snapshot and the
// orders in flight: remaining = quantity − live orders, for the missing
// items the database knows. An in-flight order counts unless it has a row
// already (live or not: a REJECTED, EXPIRED or CANCELLED one holds no
// unit) or its user holds another live order (the database refuses it: one
// live order per user per sale). A live stock addition still in its outbox
// (stock_adds) is left out of the snapshot's quantity: it is added onto
// the rebuilt record afterwards.
func countRebuild(snap orderstore.Snapshot, inflight []flashsale.OrderPlaced, missing map[int64]bool) rebuildCounts {
	live := map[int64]int64{}
	out := rebuildCounts{remaining: make(map[int64]int64, len(missing)), buyers: map[int64]redisstock.Buyer{}}
	for _, o := range snap.Live {
		live[o.ItemID]++
		out.buyers[o.UserID] = redisstock.Buyer{OrderID: o.ID, ItemID: o.ItemID, CreatedAt: o.CreatedAt}
	}
	for _, o := range inflight {
		if snap.Stored[o.OrderID] {
			continue
		}
		if _, ok := out.buyers[o.UserID]; ok {
			continue
		}
		live[o.ItemID]++
		out.buyers[o.UserID] = redisstock.Buyer{OrderID: o.OrderID, ItemID: o.ItemID, CreatedAt: time.UnixMilli(o.CreatedAtMs)}
		out.fromKafka++
	}
	for id := range missing {
		q, ok := snap.Quantity[id]
		if !ok {
			continue // not in the database: nothing to rebuild from
		}
		out.remaining[id] = max(q-live[id], 0)
	}
	return out
}

// restore writes the rebuilt records back, only the fields Redis lacks
// (redisstock.Restore), and counts the items it set.
func (r *Reconciler) restore(ctx context.Context, sale *flashsale.Sale, rb rebuildCounts) error {
	n, err := r.st.Restore(ctx, sale.ID, rb.remaining, rb.buyers)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	if n > 0 {
		r.rebuilt.Add(float64(n))
		r.log.Warn("rebuilt stock after Redis lost it", "sale", sale.ID, "items", n, "liveOrders", len(rb.buyers), "inFlightInKafka", rb.fromKafka)
	}
	return nil
}
