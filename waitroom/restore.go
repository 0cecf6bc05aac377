package waitroom

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/lua"
)

// Surviving a Redis loss.
//
// Redis holds the queue; PostgreSQL (Durable) holds a copy of what cannot
// be recomputed: the tickets in join order (the draw's membership among
// them), the pre-queue size frozen at the draw, and the cursor. The
// sale's leader checkpoints every CheckpointEvery, and at once when it
// sees the draw. Every gateway also keeps, for its own connections, each
// shopper's ticket, place and admission time, and the highest figures it
// has seen.
//
// Every script that could create a queue checks those figures (the guard,
// see store.go): a Redis that lost the queue (an empty restart) or holds
// an older one (a failover to a replica that missed the last writes)
// changes nothing, and the gateway restores: the checkpoint's tickets
// beyond what Redis has, its connections' tickets and admissions, and the
// higher of the figures. Several gateways restore side by side; the
// script only adds, so their order does not matter. Shoppers keep their
// tickets, so the draw (the same seed and n) gives them the same places,
// and the cursor resumes where it was. Tickets handed out after the last
// checkpoint to shoppers no gateway holds a connection of (polling
// shoppers) stay empty: the cursor passes them; those shoppers join again
// at the back. An admitted shopper still connected keeps its admission
// record (the same token) and counts against the capacity cap again.

// restoreTimeout bounds one restore (the checkpoint's read and the script).
const restoreTimeout = 10 * time.Second

// restore rebuilds the sale's queue in Redis from Durable and this
// gateway's connections. With Durable configured and a checkpoint known
// to exist, a failed read of it fails the restore (it is retried at the
// next tick): a restore without it would leave the checkpointed tickets
// empty for good.
func (r *Room) restore(ctx context.Context, sr *saleRoom, now time.Time) error {
	sr.restoreMu.Lock()
	defer sr.restoreMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	ttl := r.cfg.AdmissionTTL
	if sale, ok := r.sales.Sale(sr.id); ok {
		ttl = r.ttl(sale)
	}
	in := restoreInput{nowMs: now.UnixMilli(), ttlMs: ttl.Milliseconds(),
		epoch: r.id + "-" + strconv.FormatInt(r.restores.Add(1), 10)}
	if d := r.cfg.Durable; d != nil {
		st, users, tiers, found, err := d.Load(ctx, sr.id)
		sr.mu.Lock()
		has := sr.pgHas
		sr.mu.Unlock()
		switch {
		case err != nil && has:
			return fmt.Errorf("waitroom.restore: sale %d: %w", sr.id, err)
		case err != nil:
			r.log.Warn("restore without the queue checkpoint", "sale", sr.id, "err", err)
		case found:
			in.users, in.tiers = users, tiers
			sr.mu.Lock()
			sr.pgChecked, sr.pgHas = true, true
			sr.pgSt.Seq, sr.pgSt.Serving = max(sr.pgSt.Seq, st.Seq), max(sr.pgSt.Serving, st.Serving)
			if sr.pgSt.N < 0 {
				sr.pgSt.N, sr.pgSt.Tiered = st.N, st.Tiered
			}
			sr.savedSeq = st.Seq
			sr.mu.Unlock()
		}
	}
	sr.mu.Lock()
	in.st = sr.known().st
	for c := range sr.conns {
		if c.shadow {
			// A shadowed shopper's ticket is only shown: it holds no
			// place to bring back (the shadow record lives apart).
			continue
		}
		in.conns = append(in.conns, heldConn{user: c.user, ticket: c.ticket, place: c.place, admittedAt: c.admittedAt, tier: c.tier})
	}
	sr.mu.Unlock()
	// In ticket order: the script appends tickets beyond its list in turn.
	slices.SortFunc(in.conns, func(a, b heldConn) int { return cmp.Compare(a.ticket, b.ticket) })
	if sale, ok := r.sales.Sale(sr.id); ok {
		if err := restoreShardArgs(ctx, r.reservations, sale, &in); err != nil {
			return fmt.Errorf("waitroom.restore: sale %d: %w", sr.id, err)
		}
	}
	st, epoch, err := restoreQueue(ctx, r.rdb, sr.id, in)
	if err != nil {
		return err
	}
	r.m.restores.Inc()
	r.log.Info("queue restored in Redis", "sale", sr.id, "tickets", st.Seq, "prequeue", st.N, "serving", st.Serving,
		"checkpointed", len(in.users), "connections", len(in.conns))
	sr.mu.Lock()
	sr.observe(st)
	sr.epoch, sr.epochSeen = epoch, true
	sale := sr.sale
	sr.mu.Unlock()
	return r.ensureDraw(ctx, sr, sale, st)
}

// restoreSale is restore for a sale the batcher met stale.
func (r *Room) restoreSale(ctx context.Context, saleID int64) error {
	return r.restore(ctx, r.saleRoom(saleID, true), r.cfg.Now())
}

// checkpointLoop learns what Durable holds of each sale this gateway
// serves and, for the sales it leads, checkpoints the queue every
// CheckpointEvery and right after the draw, and then publishes the draw
// record (publishDraw). It never runs on the tick:
// a slow or stopped PostgreSQL does not hold admission back.
func (r *Room) checkpointLoop(ctx context.Context) {
	if r.cfg.Durable == nil && r.cfg.Records == nil {
		return
	}
	t := time.NewTicker(r.cfg.CheckpointEvery)
	defer t.Stop()
	var rooms []*saleRoom
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.drawn:
		}
		rooms = r.appendRooms(rooms[:0])
		for _, sr := range rooms {
			if ctx.Err() != nil {
				return
			}
			if r.cfg.Durable != nil {
				if err := r.checkpoint(ctx, sr); err != nil && ctx.Err() == nil {
					r.m.saves.WithLabelValues("error").Inc()
					r.log.Warn("checkpoint queue", "sale", sr.id, "err", err)
				}
			}
			// After the checkpoint: the record's members are saved first.
			if r.cfg.Records != nil {
				if err := r.publishDraw(ctx, sr); err != nil && ctx.Err() == nil {
					r.m.published.WithLabelValues("error").Inc()
					r.log.Warn("publish draw record", "sale", sr.id, "err", err)
				}
			}
		}
	}
}

// checkSaved learns what Durable holds of the sale: whether the queue
// existed (the scripts' guard) and the saved figures.
func (r *Room) checkSaved(ctx context.Context, sr *saleRoom) error {
	st, found, err := r.cfg.Durable.Saved(ctx, sr.id)
	if err != nil {
		return err
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.pgChecked {
		return nil
	}
	sr.pgChecked, sr.pgHas = true, sr.pgHas || found
	if found {
		sr.pgSt.Seq, sr.pgSt.Serving = max(sr.pgSt.Seq, st.Seq), max(sr.pgSt.Serving, st.Serving)
		if sr.pgSt.N < 0 {
			sr.pgSt.N, sr.pgSt.Tiered = st.N, st.Tiered
		}
		sr.savedSeq, sr.savedN, sr.savedServing = st.Seq, st.N, st.Serving
	} else if sr.savedSeq < 0 {
		sr.savedSeq = 0
	}
	return nil
}

// firstCheckTimeout bounds the check of Durable before a gateway's first
// tick of a sale.
const firstCheckTimeout = 2 * time.Second

// checkpointTimeout bounds one checkpoint.
const checkpointTimeout = 5 * time.Second

// checkpoint reads what Durable holds of the sale once and, while this
// gateway leads the sale, saves the tickets handed out since the last
// checkpoint and the figures.
func (r *Room) checkpoint(ctx context.Context, sr *saleRoom) error {
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	d := r.cfg.Durable
	sr.mu.Lock()
	checked := sr.pgChecked
	sr.mu.Unlock()
	if !checked {
		if err := r.checkSaved(ctx, sr); err != nil {
			return err
		}
	}
	sr.mu.Lock()
	leading, saved := sr.leadAt >= 0, sr.savedSeq
	sr.mu.Unlock()
	if !leading || saved < 0 {
		return nil
	}
	pipe := r.rdb.Pipeline()
	stCmd := pipe.HMGet(ctx, lua.QueueKey(sr.id, keyState), "live", fieldSeq, fieldN, fieldServing, fieldTiered)
	orderCmd := pipe.LRange(ctx, lua.QueueKey(sr.id, keyOrder), saved, -1)
	tiersCmd := pipe.GetRange(ctx, lua.QueueKey(sr.id, keyTiers), saved, -1)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return fmt.Errorf("waitroom.checkpoint: %w", err)
	}
	vals := stCmd.Val()
	if len(vals) != 5 || vals[0] == nil {
		return nil // the queue is gone from Redis: a restore comes first
	}
	seq, serving := toInt(vals[1]), toInt(vals[3])
	n := int64(-1)
	if vals[2] != nil {
		n = toInt(vals[2])
	}
	tiered := vals[4] != nil
	// tiers[i] is ticket saved+i's tier (a join between the reads may
	// add a tier past the list read: Save takes only the tickets' own).
	tiers := []byte(tiersCmd.Val())
	ids := orderCmd.Val()
	// The list and seq move together (joinScript); take no more than seq
	// says, in case a join landed between the two reads.
	if over := saved + int64(len(ids)) - seq; over > 0 && over <= int64(len(ids)) {
		ids = ids[:int64(len(ids))-over]
	}
	users := make([]int64, len(ids))
	for i, s := range ids {
		users[i], _ = strconv.ParseInt(s, 10, 64) // "0" (or junk): no known holder
	}
	sr.mu.Lock()
	same := len(users) == 0 && n == sr.savedN && serving == sr.savedServing
	sr.mu.Unlock()
	if same {
		return nil
	}
	got, err := d.Save(ctx, sr.id, saved, users, tiers, queueState{N: n, Serving: serving, Tiered: tiered})
	if err != nil {
		return err
	}
	r.m.saves.WithLabelValues("ok").Inc()
	sr.mu.Lock()
	sr.pgHas = true
	sr.savedSeq, sr.savedN, sr.savedServing = got, n, serving
	sr.pgSt.Seq, sr.pgSt.Serving = max(sr.pgSt.Seq, got), max(sr.pgSt.Serving, serving)
	if sr.pgSt.N < 0 {
		sr.pgSt.N, sr.pgSt.Tiered = n, tiered
	}
	sr.mu.Unlock()
	return nil
}
