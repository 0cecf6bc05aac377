package waitroom

import (
	"context"
	"time"

	"github.com/flashsale/flashsale"
)

// broadcast computes the view of every local connection of the sale,
// records new admissions with one script call and queues the changed
// statuses. It never writes to a socket. It returns the number of local
// connections waiting.
func (r *Room) broadcast(ctx context.Context, sr *saleRoom, now time.Time, tick uint64, regular bool, competing int64) int {
	start := time.Now()
	defer func() { r.m.broadcast.Observe(time.Since(start).Seconds()) }()
	var admit, expired []*conn
	var present []heldConn
	waiting := 0
	pingSlots := uint64(max(1, r.cfg.IdleTimeout/2/r.cfg.Tick))
	statusSlots := uint64(max(1, r.cfg.StatusEvery/r.cfg.Tick))
	var ping, kick []*conn
	waited := 0
	blocker, _ := r.guard.(Blocker)
	sr.mu.Lock()
	opens := sr.sale.StartsAt.UnixMilli()
	queue := sr.sale.QueueOrder()
	ttlMs := r.ttl(sr.sale).Milliseconds()
	// The opening hold: position updates wait and pings may wait one
	// period, so that the opening's CPU goes to the first wave's
	// purchases (Config.OpeningHold).
	hold := r.cfg.OpeningHold > 0 && now.UnixMilli() >= opens && now.Before(sr.sale.StartsAt.Add(r.cfg.OpeningHold))
	busy := hold || competingBusy(r.cfg.WaitingPushes, r.cfg.Tick, competing)
	held := 0
	// Presence: every beatEvery, the admitted shoppers connected here are
	// marked present, so that the leader does not count them gone.
	// (Queue order has no capacity cap to free: no marks.)
	beat := regular && r.cfg.AdmittedGrace > 0 && now.Sub(sr.lastBeat) >= r.cfg.beatEvery() && !queue
	if beat {
		sr.lastBeat = now
	}
	// WAITING statuses due: shoppers entering WAITING, then position
	// updates; sent after the loop, front of the queue first, within the
	// tick's budget.
	entering, moved := sr.entering[:0], sr.moved[:0]
	for c := range sr.conns {
		if blocker != nil && len(kick) < maxKicksPerTick && blocker.Blocked(c.ip, c.user) {
			kick = append(kick, c)
			continue
		}
		if regular && c.seq%pingSlots == tick%pingSlots {
			if busy && !c.pingWaited {
				c.pingWaited = true
				waited++
			} else {
				c.pingWaited = false
				ping = append(ping, c)
			}
		}
		if c.place < 0 {
			if p, ok := sr.place(c.ticket); ok {
				c.place = p
			}
		}
		if beat && c.admittedAt != 0 && !c.bought && now.UnixMilli() < c.admittedAt+ttlMs {
			present = append(present, heldConn{user: c.user, place: c.place})
		}
		v := c.viewOf(sr, now)
		if v.state == StateAdmitted && c.admittedAt == 0 {
			admit = append(admit, c)
			continue
		}
		if v.state == StateAdmitted && c.admittedAt != 0 && !c.bought && now.UnixMilli() >= c.admittedAt+ttlMs &&
			len(expired) < maxRequeuePerTick {
			expired = append(expired, c)
			continue
		}
		r.sendMessage(sr, c)
		if v.state == StateWaiting || v.state == StatePrequeue || v.state == StatePaused {
			waiting++
		}
		if v == c.last {
			continue
		}
		// A shopper whose chosen item sells out (or is back) is told at
		// once, whatever the pacing: they may choose another.
		if v.state == StateWaiting && v.chosenOut() == c.last.chosenOut() {
			if c.last.state != StateWaiting {
				entering = append(entering, dueStatus{c, v})
			} else if tick-c.lastTick >= statusSlots {
				if hold {
					held++
				} else {
					moved = append(moved, dueStatus{c, v})
				}
			}
			continue
		}
		c.last, c.lastTick = v, tick
		c.push(v, opens, nil)
	}
	budget := waitingBudget(r.cfg.WaitingPushes, r.cfg.Tick, len(admit), competing)
	deferred := 0
	for _, due := range [][]dueStatus{entering, moved} {
		if budget >= 0 && len(due) > budget {
			// Front of the queue first; with no budget left (a tick of
			// many admissions, as at an opening) there is nothing to pick.
			frontFirst(due, budget)
			deferred += len(due) - budget
			due = due[:budget]
		}
		for _, d := range due {
			d.c.last, d.c.lastTick = d.v, tick
			d.c.push(d.v, opens, nil)
		}
		if budget >= 0 {
			budget -= len(due)
		}
	}
	clear(entering)
	clear(moved)
	sr.entering, sr.moved = entering[:0], moved[:0]
	sr.mu.Unlock()
	r.m.deferred.Add(float64(deferred + held))
	if waited > 0 {
		r.m.pings.WithLabelValues("waited").Add(float64(waited))
	}
	if len(ping) > 0 {
		r.m.pings.WithLabelValues("sent").Add(float64(len(ping)))
	}
	for _, c := range ping {
		r.ping(c)
	}
	// Shoppers blocked after they joined lose their connection with BLOCKED
	// (a bounded number per tick: each close waits up to a second for the
	// error message to go out).
	for _, c := range kick {
		c.fail(errBlockedNow)
	}
	if len(expired) > 0 {
		r.requeueConns(ctx, sr, expired, now)
	}
	if len(present) > 0 {
		r.markPresent(ctx, sr.id, present, now)
	}
	if len(admit) == 0 {
		return waiting
	}
	users := make([]int64, len(admit))
	places := make([]int64, len(admit))
	for i, c := range admit {
		users[i], places[i] = c.user, c.place
	}
	at, err := admitUsers(ctx, r.rdb, sr.id, now.UnixMilli(), !queue, users, places)
	if err != nil {
		r.log.Warn("record admissions", "sale", sr.id, "err", err)
		return waiting
	}
	heldItem := make([]int64, len(users))
	if queue {
		if heldItem, err = readHeldItems(ctx, r.rdb, sr.id, users); err != nil {
			r.log.Warn("read held items", "sale", sr.id, "err", err)
			return waiting
		}
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	for i, c := range admit {
		if at[i] == 0 && queue && c.chosen != 0 && c.admittedAt == 0 {
			// Passed over: the chosen item had no unit free at the turn.
			// The shopper keeps the place, next for that item.
			v := sr.passedView(c.chosen)
			if v != c.last {
				c.last, c.lastTick = v, tick
				c.push(v, opens, nil)
			}
			continue
		}
		if at[i] == 0 || c.admittedAt != 0 {
			continue
		}
		c.admittedAt, c.heldItem = at[i], heldItem[i]
		v := view{state: StateAdmitted, out: sr.out}
		c.last = v
		c.push(v, opens, r.admittedMessage(sr, c.user, at[i], heldItem[i]))
	}
	return waiting
}

// sendMessage queues the sale's message to c when c has not had it: a new
// message, or "" with the time it was seen cleared. Called with sr.mu held.
func (r *Room) sendMessage(sr *saleRoom, c *conn) {
	s := sr.sale
	if s == nil {
		return
	}
	text, at := s.Message, s.MessageAt.UnixMilli()
	if text == "" {
		if c.msgText == "" {
			return
		}
		at = r.cfg.Now().UnixMilli()
	}
	if text == c.msgText && (text == "" || at == c.msgAt) {
		return
	}
	c.msgText, c.msgAt = text, at
	c.pushMessage(appendMessage(nil, text, at))
}

// dueStatus is a WAITING status due to a connection, held by broadcast
// until the tick's budget is known.
type dueStatus struct {
	c *conn
	v view
}

const maxKicksPerTick = 64

var errBlockedNow = &flashsale.Error{Code: flashsale.CodeBlocked, Message: "access blocked"}
