package waitroom

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// bucketMs is the width of the admission-count buckets of the capacity cap.
const bucketMs = 1000

// advanceLoop moves the admission cursor of the sales this gateway leads
// once a Tick, apart from the tick loop. A broadcast goes over every local
// connection, so on a gateway short of CPU it can outlast many ticks, and
// the cursor, which every gateway admits by, must not wait for it. This
// loop does two Redis calls and little else, so it keeps the rate.
func (r *Room) advanceLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.Tick)
	defer t.Stop()
	var rooms []*saleRoom
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rooms = r.appendRooms(rooms[:0])
		for _, sr := range rooms {
			sr.mu.Lock()
			leading := sr.leadAt >= 0
			sr.mu.Unlock()
			if !leading {
				continue
			}
			if _, err := r.refresh(ctx, sr.id, r.cfg.Now()); err != nil && ctx.Err() == nil {
				r.log.Warn("advance sale", "sale", sr.id, "err", err)
			}
		}
	}
}

// refresh reads one sale's stock and queue state (and, as leader,
// advances its queue). It returns the sale room, or nil when the sale is
// unknown.
func (r *Room) refresh(ctx context.Context, id int64, now time.Time) (*saleRoom, error) {
	sale, ok := r.sales.Sale(id)
	if !ok {
		return nil, nil
	}
	// The stock is known only when every item of the sale has a record: a
	// Redis that just lost the stock (the reconciler rebuilds it) says
	// nothing about it. Unknown stock admits nobody and changes no
	// sold-out state; it is not zero.
	rem, err := r.stock.Remaining(ctx, id)
	if err != nil {
		r.log.Warn("read stock", "sale", id, "err", err)
	}
	total, soldOut, stockKnown := int64(0), true, err == nil && len(sale.Items) > 0
	for _, it := range sale.Items {
		v, ok := rem[it.ID]
		if !ok {
			stockKnown = false
			break
		}
		if v > 0 {
			total += v
			soldOut = false
		}
	}
	capLimit := int64(-1)
	ended := !sale.EndsAt.IsZero() && !now.Before(sale.EndsAt)
	// A paused sale admits nobody: the cursor stays (the draw still
	// happens at the opening).
	// A sale allocated in queue order admits by holds (allocate), not by
	// the rate and the capacity cap.
	if stockKnown && !ended && !sale.Paused && !sale.QueueOrder() {
		capLimit = int64(math.Floor(r.cfg.CapacityFactor * float64(total)))
		if soldOut {
			capLimit = capSoldOutN
		}
	}
	sr := r.saleRoom(id, true)
	r.firstCheck(ctx, sr)
	grace := r.cfg.AdmittedGrace.Milliseconds()
	if grace < 0 {
		grace = 0
	}
	var rep tickReply
	for attempt := 0; ; attempt++ {
		rep, err = tickSale(ctx, r.rdb, r.reservations, sale, tickArgs{
			me: r.id, nowMs: now.UnixMilli(), drawAtMs: DrawAt(sale, r.cfg.DrawLead).UnixMilli(), leaseMs: r.cfg.LeaseTTL.Milliseconds(), rate: sale.AdmissionRatePerSecond,
			capLimit: capLimit, ttlMs: r.cfg.AdmissionTTL.Milliseconds(), bucketMs: bucketMs, graceMs: grace,
			known: sr.knownNow(),
		})
		if err != nil {
			return nil, err
		}
		// A new epoch: another gateway restored the queue after a loss;
		// this one brings its connections in too.
		sr.mu.Lock()
		moved := sr.epochSeen && rep.epoch != sr.epoch
		if !rep.stale && !moved {
			sr.epoch, sr.epochSeen = rep.epoch, true
		}
		sr.mu.Unlock()
		if !rep.stale && !moved {
			break
		}
		if attempt > 0 {
			return nil, fmt.Errorf("waitroom.refresh: sale %d: %w", id, errStale)
		}
		if err := r.restore(ctx, sr, now); err != nil {
			return nil, err
		}
	}
	if rep.leader && sale.QueueOrder() && stockKnown {
		var serving int64
		if rem, serving, err = r.allocate(ctx, sr, sale, rep.st, rem, now); err != nil {
			r.log.Warn("allocate held units", "sale", id, "err", err)
		}
		// The places the pass admitted (their records are written with
		// the cursor) are admitted by this tick's broadcast.
		rep.st.Serving = max(rep.st.Serving, serving)
		soldOut = true
		for _, it := range sale.Items {
			soldOut = soldOut && rem[it.ID] <= 0
		}
	} else if rep.leader && sale.QueueOrder() {
		r.markHoldsLost(ctx, sale)
	}
	if err := r.ensureDraw(ctx, sr, sale, rep.st); err != nil {
		r.log.Warn("read the draw's tiers", "sale", id, "err", err)
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.setSale(sale)
	leader, st := rep.leader, rep.st
	drawnBefore := sr.st.N >= 0
	sr.observe(st)
	sr.loaded = true
	r.tally.queue(id, now, sr.st)
	if stockKnown {
		sr.soldOut = r.resumeHeld(sr, soldOut, now)
		r.showItems(sr, rem, now)
	}
	if leader && !drawnBefore && sr.st.N >= 0 {
		select {
		case r.drawn <- struct{}{}:
		default:
		}
	}
	// The tick loop and advanceLoop both refresh: keep the samples in time
	// order and count each admitted place once.
	if sr.nsample == 0 || now.UnixMilli() > sr.samples[(sr.nsample-1)%rateSamples].ms {
		sr.samples[sr.nsample%rateSamples] = struct{ ms, serving int64 }{now.UnixMilli(), sr.st.Serving}
		sr.nsample++
	}
	r.notifyPassed(sr, sale, leader, st)
	// The leading gauge moves only where leadAt crosses -1, so it counts
	// the sales whose lease this gateway holds.
	if leader {
		if sr.leadAt >= 0 && st.Serving > sr.leadAt {
			r.m.admitted.Add(float64(st.Serving - sr.leadAt))
		}
		if sr.leadAt < 0 {
			r.m.leading.Inc()
		}
		sr.leadAt = max(sr.leadAt, st.Serving)
	} else {
		if sr.leadAt >= 0 {
			r.m.leading.Dec()
		}
		sr.leadAt = -1
	}
	return sr, nil
}

// firstCheck asks Durable, once, whether the sale's queue existed. A
// gateway that has just started knows nothing of the queue; its first
// tick or join must not take an empty Redis for a new queue when the
// checkpoint says otherwise. Asked once (the checkpoint loop asks again
// until it knows), so a PostgreSQL outage costs one bounded wait, not one
// per tick.
func (r *Room) firstCheck(ctx context.Context, sr *saleRoom) {
	if r.cfg.Durable == nil {
		return
	}
	// Concurrent first looks (a poll, the tick loop) wait for the one
	// check: none may tick before it is answered.
	sr.askMu.Lock()
	defer sr.askMu.Unlock()
	sr.mu.Lock()
	first := !sr.pgChecked && !sr.pgAsked
	sr.pgAsked = true
	sr.mu.Unlock()
	if !first {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, firstCheckTimeout)
	defer cancel()
	if err := r.checkSaved(cctx, sr); err != nil && ctx.Err() == nil {
		r.log.Warn("read the queue checkpoint", "sale", sr.id, "err", err)
	}
}

// openingSlack is how long after a sale's opening instant its own tick
// runs (clocks of gateways and Redis differ by a little).
const openingSlack = 2 * time.Millisecond

// tickAll runs one tick over every sale this gateway serves or that has a
// queue in Redis. It returns how long until the earliest opening of those
// sales that falls before the next tick (0: none does). An extra tick
// (regular false: one run for an opening between two ticks) keeps the tick
// count, so it sends no pings and does not hasten the paced statuses.
func (r *Room) tickAll(ctx context.Context, regular bool) (untilOpening time.Duration) {
	if ctx.Err() != nil {
		return 0
	}
	now := r.cfg.Now()
	ids := map[int64]bool{}
	r.mu.Lock()
	if regular {
		r.tickCount++
	}
	tick := r.tickCount
	for id := range r.rooms {
		ids[id] = true
	}
	r.mu.Unlock()
	active, err := r.rdb.SMembers(ctx, activeKey).Result()
	if err != nil && ctx.Err() == nil {
		r.log.Warn("read active sales", "err", err)
	}
	for _, s := range active {
		if id, err := strconv.ParseInt(s, 10, 64); err == nil {
			ids[id] = true
		}
	}
	// Requests since the last regular tick; an extra tick uses the last
	// regular tick's figure.
	if regular && r.cfg.Competing != nil {
		n := r.cfg.Competing()
		r.competingDelta, r.competing = n-r.competing, n
	}
	competing := r.competingDelta
	waiting := 0
	for id := range ids {
		sr, err := r.refresh(ctx, id, now)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("tick sale", "sale", id, "err", err)
			}
			continue
		}
		if sr == nil {
			continue
		}
		waiting += r.broadcast(ctx, sr, now, tick, regular, competing)
		r.reissueHolds(ctx, sr, now)
		r.checkShadowed(ctx, sr, now)
		r.retire(ctx, sr, now)
		if d := sr.untilOpening(now, r.cfg.Tick, r.cfg.DrawLead); d > 0 && (untilOpening == 0 || d < untilOpening) {
			untilOpening = d
		}
	}
	r.m.waiting.Set(float64(waiting))
	return untilOpening
}

// retire forgets a sale that has ended and has no local connections, and
// sets its queue keys to expire (Config.QueueKeyTTL).
func (r *Room) retire(ctx context.Context, sr *saleRoom, now time.Time) {
	sr.mu.Lock()
	ended := sr.sale != nil && !sr.sale.EndsAt.IsZero() && now.After(sr.sale.EndsAt.Add(time.Minute))
	idle := len(sr.conns) == 0 && now.Sub(sr.touched) > time.Minute
	var endsAt time.Time
	if sr.sale != nil {
		endsAt = sr.sale.EndsAt
	}
	if ended && idle && sr.leadAt >= 0 {
		r.m.leading.Dec()
		sr.leadAt = -1
	}
	sr.mu.Unlock()
	if !ended || !idle {
		return
	}
	if err := r.expireQueue(ctx, sr.id, endsAt); err != nil {
		r.log.Warn("expire queue keys", "sale", sr.id, "err", err)
	}
	r.mu.Lock()
	delete(r.rooms, sr.id)
	r.mu.Unlock()
	if err := r.rdb.SRem(ctx, activeKey, sr.id).Err(); err != nil {
		r.log.Warn("retire sale", "sale", sr.id, "err", err)
	}
}
