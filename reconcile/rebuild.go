package reconcile

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// The Redis-loss rebuild. rebuildIfLost runs its steps in order; each
// step is a function of its own so that each rule is tested alone:
//
//  1. missingItems: which items of the sale have no stock record;
//  2. seeLoss: on the first sighting, the sale's rebuild lock (one
//     rebuild at a time in the fleet), every placement lease dropped,
//     and, for a sharded sale, every shard dropped (dropShards, not only
//     the ones its node lost); the loss is seen once that is done;
//  3. one lease TTL later (rebuildWait), under the lock still held:
//     fence: the orders topic's end offsets read, and a fence on each
//     missing item (orderstore.Fence): a record past them, of a
//     reservation made before the loss was seen, is refused by the writer;
//  4. inflightOrders: the sale's orders Kafka holds past the writer's
//     committed offsets, up to those end offsets, read before PostgreSQL;
//  5. countRebuild: from the database's snapshot (read after the fence is
//     committed) and those orders, each missing item's remaining units and
//     every live buyer's record;
//  6. restore: the records written back, only the fields Redis lacks.
//
// Why one lease TTL is enough: every reservation the lost Redis took was
// made before the loss was seen, and none of them is acknowledged (202)
// later than one lease TTL after it (purchase.Leaser.Holds: the lease it
// was made under was dropped in step 2, or it was made under none), so
// every acknowledged record is below the end offsets read in step 3 and
// counted. A record that lands later is either the rebuilt Redis's (made
// after the restore less the reserve's 2 s bound, so after the loss was
// seen: not fenced) or the lost one's: refused, its unit counted as
// unsold. Before fences the rebuild waited one publish bound (5 s) for
// every record in flight to land.

// rebuildLockSlack is how much longer than the wait the rebuild lock
// lives: more than one rebuild step may take (watchLoss bounds each at 30
// s), so that a lock never lapses under a live rebuild; a rebuilder that
// died leaves the next one to start after it.
const rebuildLockSlack = 31 * time.Second

// loss is a sale's loss as this reconciler rebuilds it.
type loss struct {
	seen  time.Time // when the loss was seen: the fence's Before
	token string    // this reconciler's rebuild lock
	// end is the end offsets the fence was written with, once it was: a
	// rebuild tried again counts up to them, under the same fence.
	end map[int32]int64
}

// rebuildWait is how long a rebuild waits after the loss was seen: one
// lease TTL, or without leases one publish bound.
func (r *Reconciler) rebuildWait() time.Duration {
	if r.leaseTTL > 0 {
		return r.leaseTTL
	}
	return r.publish
}

// rebuildIfLost rebuilds the sale's Redis stock and buyer records when
// Redis has no stock record for some of its items, from PostgreSQL's live
// orders and the orders still in flight in Kafka, one rebuildWait after
// the loss was seen; until then, and while Kafka cannot be read, the
// sale's reservations answer 503. Another reconciler holding the sale's
// rebuild lock rebuilds it instead.
func (r *Reconciler) rebuildIfLost(ctx context.Context, sale *flashsale.Sale) error {
	if len(sale.Items) == 0 {
		return nil
	}
	// Run's loss check and RunOnce both call it: one at a time, or both
	// would rebuild under the one lock this reconciler holds.
	r.rebuildMu.Lock()
	defer r.rebuildMu.Unlock()
	r.st.SetShards(sale.ID, sale.Shards())
	missing, err := r.missingItems(ctx, sale)
	if err != nil {
		return err
	}
	l := r.noteLoss(sale.ID, len(missing) > 0)
	if len(missing) == 0 {
		if l != nil {
			// Whole again without this rebuild (a loss seen in a
			// moment of doubt): the lock is given up, not left to
			// hold off the next loss's rebuild until it lapses.
			r.unlock(ctx, sale.ID, l.token)
		}
		return nil
	}
	if l == nil {
		return r.seeLoss(ctx, sale, missing)
	}
	if r.now().Before(l.seen.Add(r.rebuildWait())) {
		return nil
	}
	held, err := r.st.HoldsRebuild(ctx, sale.ID, l.token)
	if err != nil {
		return err
	}
	if !held {
		// The lock lapsed under a rebuild that kept failing (or Redis
		// was lost again): seen anew from the next check.
		r.forgetLoss(sale.ID)
		return nil
	}
	if err := r.rebuild(ctx, sale, missing, l); err != nil {
		return err
	}
	r.forgetLoss(sale.ID)
	r.unlock(ctx, sale.ID, l.token)
	return nil
}

// unlock gives the sale's rebuild lock up (a failure is logged: the lock
// lapses by itself).
func (r *Reconciler) unlock(ctx context.Context, saleID int64, token string) {
	if err := r.st.UnlockRebuild(ctx, saleID, token); err != nil {
		r.log.Warn("rebuild lock not given up; it lapses by itself", "sale", saleID, "err", err)
	}
}

// seeLoss is the first sighting of a loss by this reconciler: unless
// another holds the sale's rebuild lock, it takes it, drops every
// placement lease (so that no reservation made before is acknowledged
// after one lease TTL, wherever the leases were kept) and a sharded
// sale's every shard, and notes the loss as seen now.
func (r *Reconciler) seeLoss(ctx context.Context, sale *flashsale.Sale, missing map[int64]bool) error {
	token := uuid.NewString()
	ok, err := r.st.LockRebuild(ctx, sale.ID, token, r.rebuildWait()+rebuildLockSlack)
	if err != nil || !ok {
		return err // !ok: another reconciler rebuilds it
	}
	err = r.dropShards(ctx, sale, missing)
	if err == nil && r.leaseTTL > 0 {
		err = r.st.DropLeases(ctx)
	}
	if err != nil {
		r.unlock(ctx, sale.ID, token)
		return err
	}
	r.lostMu.Lock()
	r.lost[sale.ID] = &loss{seen: r.now(), token: token}
	r.lostMu.Unlock()
	r.log.Warn("Redis lost the sale's stock; rebuilding after one lease TTL", "sale", sale.ID, "items", len(missing), "wait", r.rebuildWait())
	return nil
}

// rebuild fences off, counts and restores the missing items of loss l
// (steps 3 to 6). Tried again after a failure, it keeps the fence it
// wrote and counts up to its offsets.
func (r *Reconciler) rebuild(ctx context.Context, sale *flashsale.Sale, missing map[int64]bool, l *loss) error {
	committed, end, err := r.progress(ctx)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	switch {
	case l.end != nil:
		end = l.end
	case end != nil:
		items := slices.Collect(maps.Keys(missing))
		if err := r.store.AddFence(ctx, sale.ID, items, orderstore.NewFence(l.seen, end)); err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
		l.end = end
	}
	// Kafka before PostgreSQL: an order the writer stores between the two
	// reads is then found in the database, never missed by both.
	inflight, err := r.inflightOrders(ctx, sale, committed, end)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	ids := make([]string, len(inflight))
	for i, o := range inflight {
		ids[i] = o.OrderID
	}
	// One snapshot of items, their fences, live orders and which in-flight
	// orders have a row already.
	snap, err := r.store.ReadSnapshot(ctx, sale.ID, ids)
	if err != nil {
		return fmt.Errorf("rebuild: read database: %w", err)
	}
	return r.restore(ctx, sale, countRebuild(snap, inflight, missing))
}

// progress is the writer group's committed offsets and the orders topic's
// end offsets; none without an OrderLog.
func (r *Reconciler) progress(ctx context.Context) (committed, end map[int32]int64, err error) {
	if r.orders == nil {
		return nil, nil, nil
	}
	kctx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	defer cancel()
	return r.orders.Progress(kctx)
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

// noteLoss returns the sale's loss this reconciler is rebuilding (nil:
// none); a sale whose records are all there (!lost) has it forgotten, so
// that a later loss is seen anew.
func (r *Reconciler) noteLoss(saleID int64, lost bool) *loss {
	r.lostMu.Lock()
	defer r.lostMu.Unlock()
	l := r.lost[saleID]
	if !lost {
		delete(r.lost, saleID)
	}
	return l
}

// forgetLoss forgets the sale's loss: rebuilt, or its lock lapsed.
func (r *Reconciler) forgetLoss(saleID int64) {
	r.lostMu.Lock()
	delete(r.lost, saleID)
	r.lostMu.Unlock()
}

// dropShards, for a sharded sale, drops every shard's records and marks
// every item missing. A node lost some shards of the sale only; the
// database knows how many units remain, not on which shard, and the shards
// still there keep selling: dropping them all makes the whole sale stand
// still until it is rebuilt from exact counts, as one shard would after
// losing its node. On failure the loss is not seen yet, so the next check
// sees it first again and drops again.
func (r *Reconciler) dropShards(ctx context.Context, sale *flashsale.Sale, missing map[int64]bool) error {
	if r.st.Shards(sale.ID) <= 1 {
		return nil
	}
	if err := r.st.Drop(ctx, sale.ID); err != nil {
		return fmt.Errorf("drop the sale's shards: %w", err)
	}
	for _, it := range sale.Items {
		missing[it.ID] = true
	}
	return nil
}

// inflightOrders returns the sale's orders in the orders topic from the
// writer group's committed offsets up to end (as progress read them),
// each once, leaving out those the writer will dead-letter (an order id
// no row can carry, an item not in the sale). None without an OrderLog.
func (r *Reconciler) inflightOrders(ctx context.Context, sale *flashsale.Sale, committed, end map[int32]int64) ([]kafka.LoggedOrder, error) {
	if r.orders == nil {
		return nil, nil
	}
	// Reading the backlog may take longer than one question.
	all, err := r.orders.Unconsumed(ctx, committed, end)
	if err != nil {
		return nil, err
	}
	var inflight []kafka.LoggedOrder
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
// unit), its user holds another live order (the database refuses it: one
// live order per user per sale), or a fence of an earlier rebuild refuses
// it (the writer will). A live stock addition still in its outbox
// (stock_adds) is left out of the snapshot's quantity: it is added onto
// the rebuilt record afterwards.
func countRebuild(snap orderstore.Snapshot, inflight []kafka.LoggedOrder, missing map[int64]bool) rebuildCounts {
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
		if slices.ContainsFunc(snap.Fences[o.ItemID], func(f orderstore.Fence) bool {
			return f.Refuses(o.Partition, o.Offset, time.UnixMilli(o.CreatedAtMs))
		}) {
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
