package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// Reclaim: the reservations a gateway had in flight when it died or froze
// are settled as soon as its placement lease lapses (purchase/lease.go), not after
// the reconcile bound. The reservations made under the lease's slot are
// found in the owners records (redisstock.Owned); each one the writer has
// not stored is declared lost once Kafka proves it was not in the log when
// the lease lapsed: a reading of the orders topic taken after the lapse
// was seen (the mark), whose end offsets the writer group has committed
// since. A record acknowledged under the lease was so before the lease
// stopped being valid at its gateway, so before the lapse and the mark:
// the writer has stored it, and declareLost then confirms it instead. A
// record the gateway sends later (it wakes from a freeze) meets the
// tombstone, and the gateway answers it 503 (purchase.Leaser.Holds). Once every
// reservation of the slot is settled, the slot is freed for another
// gateway.

// lapse is one lapsed lease being reclaimed.
type lapse struct {
	lease  redisstock.Lease
	mark   kafkaView
	marked bool
}

// watchLeases reclaims lapsed leases every sixth of the lease TTL until ctx
// ends.
func (r *Reconciler) watchLeases(ctx context.Context) {
	t := time.NewTicker(r.leaseTTL / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := r.ReclaimOnce(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.failures.Inc()
			r.log.Warn("reclaim of a lapsed placement lease failed; retrying", "err", err, "returned", n)
		} else if n > 0 {
			r.log.Info("returned the reservations of a lapsed placement lease", "returned", n)
		}
	}
}

// committedPast reports whether the group has committed every partition up
// to end.
func committedPast(committed, end map[int32]int64) bool {
	for p, e := range end {
		if committed[p] < e {
			return false
		}
	}
	return true
}

// ReclaimOnce is one step of the reclaim: it looks for lapsed leases,
// takes or checks their Kafka marks, settles the reservations of the
// leases whose proof is complete, frees their slots, and reports how many
// units went back. Only one goroutine may call it at a time (several
// reconcilers may run it at once: the tombstones and the release script
// settle an order once).
func (r *Reconciler) ReclaimOnce(ctx context.Context) (int, error) {
	if r.leaseTTL <= 0 {
		return 0, nil
	}
	lapsed, err := r.st.LapsedLeases(ctx, r.leaseTTL)
	if err != nil {
		return 0, err
	}
	seen := make(map[int]bool, len(lapsed))
	for _, l := range lapsed {
		seen[l.Slot] = true
		if lp := r.lapses[l.Slot]; lp == nil || lp.lease != l {
			r.lapses[l.Slot] = &lapse{lease: l}
			r.log.Warn("a gateway's placement lease lapsed; settling its reservations in flight", "slot", l.Slot)
		}
	}
	for slot := range r.lapses {
		if !seen[slot] {
			delete(r.lapses, slot) // freed by another reconciler
		}
	}
	if len(r.lapses) == 0 {
		return 0, nil
	}
	view := r.readKafka(ctx)
	if !view.ok {
		return 0, nil
	}
	ready := map[int]bool{}
	for slot, lp := range r.lapses {
		switch {
		case !lp.marked:
			lp.mark, lp.marked = view, true
			if view.none {
				ready[slot] = true
			}
		case view.none || committedPast(view.committed, lp.mark.end):
			ready[slot] = true
		}
	}
	if len(ready) == 0 {
		return 0, nil
	}
	returned := 0
	left := map[int]int{}
	var errs []error
	for _, sale := range r.sales.Sales() {
		r.st.SetShards(sale.ID, sale.Shards())
		owned, err := r.st.Owned(ctx, sale.ID, ready)
		if err != nil {
			errs = append(errs, fmt.Errorf("sale %d: %w", sale.ID, err))
			for slot := range ready {
				left[slot]++
			}
			continue
		}
		done := make([]redisstock.Owned, 0, len(owned))
		for _, o := range owned {
			if o.Live && !o.Placed {
				// The writer has every record that was in Kafka at the
				// mark: one it stored is confirmed, one it never saw is
				// lost.
				ok, err := r.declareLost(ctx, sale, o.Pending)
				if err != nil {
					errs = append(errs, fmt.Errorf("order %s: %w", o.OrderID, err))
					left[o.Slot]++
					continue
				}
				if ok {
					returned++
				}
			}
			// Settled, given back at once, or placed in Kafka (the writer
			// stores and confirms it): the lease no longer matters.
			done = append(done, o)
		}
		if err := r.st.Disown(ctx, done); err != nil {
			errs = append(errs, err)
		}
	}
	for slot := range ready {
		if left[slot] > 0 {
			continue
		}
		if _, err := r.st.FreeLease(ctx, r.lapses[slot].lease, r.leaseTTL); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(r.lapses, slot)
	}
	if err := errors.Join(errs...); err != nil {
		return returned, fmt.Errorf("reconcile.Reconciler.ReclaimOnce: %w", err)
	}
	return returned, nil
}
