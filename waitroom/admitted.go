package waitroom

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/flashsale/flashsale"
)

// markPresent marks admitted connections present (admitScript, which
// writes no record for them: they have one), in calls of at most
// maxPresentPerCall users.
func (r *Room) markPresent(ctx context.Context, saleID int64, conns []heldConn, now time.Time) {
	for len(conns) > 0 {
		part := conns[:min(len(conns), maxPresentPerCall)]
		conns = conns[len(part):]
		users := make([]int64, len(part))
		places := make([]int64, len(part))
		for i, c := range part {
			users[i], places[i] = c.user, c.place
		}
		if _, err := admitUsers(ctx, r.rdb, saleID, now.UnixMilli(), true, users, places); err != nil {
			r.log.Warn("mark admitted shoppers present", "sale", saleID, "err", err)
			return
		}
	}
}

const maxPresentPerCall = 1000

// maxRequeuePerTick bounds the expired admissions one broadcast sends to
// the back of the queue (the rest wait for the next tick).
const maxRequeuePerTick = 1000

// requeue sends users whose admission expired unused to the back of the
// queue, as their rejoin would (the join script gives a user whose
// admission record is older than the token's life a new ticket). Users
// who bought in the sale (a buyer record in Redis) are not sent back: they
// are reported in bought, and keep their place.
func (r *Room) requeue(ctx context.Context, sr *saleRoom, users []int64, now time.Time) (tickets map[int64]joinTicket, bought map[int64]bool, err error) {
	sr.mu.Lock()
	sale := sr.sale
	sr.mu.Unlock()
	if sale.QueueOrder() && r.cfg.Holds != nil {
		// A hold is a buyer record until it lapses: a shopper whose
		// window just ended waits for the leader's lapse (its next tick)
		// and is looked at again then.
		rest := users[:0:0]
		for _, u := range users {
			_, _, held, err := r.cfg.Holds.Held(ctx, sale.ID, u)
			if err != nil {
				return nil, nil, fmt.Errorf("waitroom.requeue: %w", err)
			}
			if !held {
				rest = append(rest, u)
			}
		}
		users = rest
	}
	// Each user's buyer record is on its home shard, which the stock
	// knows (redisstock).
	recs, err := r.reservations.BuyerRecords(ctx, sale, users)
	if err != nil {
		return nil, nil, fmt.Errorf("waitroom.requeue: %w", err)
	}
	bought = map[int64]bool{}
	var again []int64
	for i, u := range users {
		if recs[i] {
			bought[u] = true
		} else if !slices.Contains(again, u) {
			again = append(again, u)
		}
	}
	tickets = map[int64]joinTicket{}
	if len(again) == 0 {
		return tickets, bought, nil
	}
	// Their identity keys were checked at their first join.
	// After the draw: their new tickets have no tier to keep.
	qs := make([]*joinReq, len(again))
	for i, u := range again {
		qs[i] = &joinReq{sale: sale, user: u}
	}
	_, ts, err := registerJoins(ctx, r.rdb, sale, r.cfg.DrawLead, now.UnixMilli(), r.ttl(sale).Milliseconds(), sr.knownNow(), false, qs)
	if err != nil {
		return nil, nil, err
	}
	for i, u := range again {
		tickets[u] = ts[i]
	}
	return tickets, bought, nil
}

// requeueConns applies requeue to connections whose admission expired: a
// new ticket (their next status is WAITING, at the back), or, for a buyer,
// no further look.
func (r *Room) requeueConns(ctx context.Context, sr *saleRoom, conns []*conn, now time.Time) {
	users := make([]int64, len(conns))
	for i, c := range conns {
		users[i] = c.user
	}
	tickets, bought, err := r.requeue(ctx, sr, users, now)
	if err != nil {
		r.log.Warn("requeue expired admissions", "sale", sr.id, "err", err)
		return
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	for _, c := range conns {
		if bought[c.user] {
			c.bought = true
			continue
		}
		if t, ok := tickets[c.user]; ok {
			c.ticket, c.place, c.admittedAt = t.ticket, -1, 0
			if t.ticket == ticketShadowed {
				// Shadowed since (a join of theirs elsewhere): from now
				// on this page shows the shadow queue.
				sr.shadow(c, t.shown)
			}
		}
	}
}

// ttl is how long an admission of the sale lasts: the claim window in
// queue order (from the record's time, the window's start), the
// admission TTL otherwise.
func (r *Room) ttl(sale *flashsale.Sale) time.Duration {
	if sale.QueueOrder() {
		return sale.Window()
	}
	return r.cfg.AdmissionTTL
}

func (r *Room) expiry(sale *flashsale.Sale, admittedAtMs int64) time.Time {
	return time.UnixMilli(admittedAtMs).Add(r.ttl(sale))
}

// notBefore is when an admission made at admittedAtMs buys: the opening
// for the first wave (admitted before it), zero (at once) otherwise. It is
// the opening rounded up to the millisecond: tokens and pages count in
// milliseconds, and a purchase at the rounded-down instant would still be
// before the opening.
func notBefore(sale *flashsale.Sale, admittedAtMs int64) time.Time {
	if admittedAtMs >= sale.StartsAt.UnixMilli() {
		return time.Time{}
	}
	nb := sale.StartsAt.Truncate(time.Millisecond)
	if nb.Before(sale.StartsAt) {
		nb = nb.Add(time.Millisecond)
	}
	return nb
}

// token signs the admission made at admittedAtMs; it returns the token,
// its expiry and its not-before (zero: none).
func (r *Room) token(sale *flashsale.Sale, userID, admittedAtMs int64) (string, time.Time, time.Time) {
	exp := r.expiry(sale, admittedAtMs)
	nb := notBefore(sale, admittedAtMs)
	if sale.QueueOrder() {
		// A hold's window counts from the opening at the earliest; its
		// token buys from the opening.
		nb = notBefore(sale, sale.StartsAt.UnixMilli()-1)
	}
	return r.signer.Sign(flashsale.Admission{UserID: userID, SaleID: sale.ID, ExpiresAt: exp, NotBefore: nb}), exp, nb
}

// admittedMessage encodes the "admitted" message; heldItem is the item
// held for the shopper in queue order (0: race, every item). Called with
// sr.mu held.
func (r *Room) admittedMessage(sr *saleRoom, userID, admittedAtMs, heldItem int64) []byte {
	tok, exp, nb := r.token(sr.sale, userID, admittedAtMs)
	if heldItem == 0 {
		return appendAdmitted(make([]byte, 0, 96+len(tok)+len(sr.itemsJS)), tok, exp.UnixMilli(), unixMilli(nb), 0, sr.itemsJS)
	}
	js, _ := json.Marshal(heldItems(sr.items, heldItem))
	return appendAdmitted(make([]byte, 0, 128+len(tok)+len(js)), tok, exp.UnixMilli(), unixMilli(nb), heldItem, js)
}

// heldItems is the admitted items of a shopper holding item: that one.
func heldItems(items []AdmittedItem, item int64) []AdmittedItem {
	for _, it := range items {
		if it.ID == item {
			return []AdmittedItem{it}
		}
	}
	return []AdmittedItem{}
}

// unixMilli is t in Unix milliseconds, 0 for the zero time.
func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
