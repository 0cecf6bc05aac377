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
//
// Its steps, in order: the tick's plan (planTick), the sweep that sorts
// every connection into what it is due (sweep, sortConn), the paced
// WAITING statuses within the tick's budget (sendDue), then, outside the
// sale room's lock, the pings, kicks, requeues and presence marks
// (afterSweep) and the new admissions (admitConns). The budget is known
// only after the sweep, because this tick's admissions count first.
func (r *Room) broadcast(ctx context.Context, sr *saleRoom, now time.Time, tick uint64, regular bool, competing int64) int {
	start := time.Now()
	defer func() { r.m.broadcast.Observe(time.Since(start).Seconds()) }()
	sr.mu.Lock()
	p := r.planTick(sr, now, tick, regular, competing)
	s := r.sweep(sr, &p)
	budget := waitingBudget(r.cfg.WaitingPushes, r.cfg.Tick, len(s.admit), competing)
	deferred := sendDue(&p, budget, s.entering, s.moved)
	sr.keepScratch(s.entering, s.moved)
	sr.mu.Unlock()
	r.m.deferred.Add(float64(deferred + s.held))
	r.afterSweep(ctx, sr, &s, now)
	if len(s.admit) > 0 {
		r.admitConns(ctx, sr, &p, s.admit)
	}
	return s.waiting
}

// tickPlan is what one broadcast decides once for every connection of
// the sale.
type tickPlan struct {
	now     time.Time
	tick    uint64
	regular bool  // a tick of the ticker, not an opening's own
	opens   int64 // the sale's opening, Unix ms
	queue   bool  // allocated in queue order
	ttlMs   int64 // an admission's life (Room.ttl)
	// hold: the opening hold (Config.OpeningHold); position updates wait
	// and pings may wait one period, so that the opening's CPU goes to
	// the first wave's purchases.
	hold bool
	// busy: a connection's ping may wait one period (the opening hold, or
	// the sale's requests compete: competingBusy).
	busy bool
	// beat: the admitted shoppers connected here are marked present this
	// tick, so that the leader does not count them gone.
	beat bool
	// pingSlots and statusSlots are the ping period and the least gap
	// between two paced statuses of a connection, in ticks.
	pingSlots, statusSlots uint64
	// still: nothing a view is computed from changed since the last tick
	// (viewInputs), nor the blocklist since a sweep last checked every
	// connection against it, so a settled connection's view is the one
	// its last visit computed and the sweep passes it by.
	still bool
	// blocksGen is the blocklist's generation (Blocker.BlocksGen; 0 with
	// no Blocker).
	blocksGen uint64
	drawn     bool // the sale's places are drawn (before, nobody has one)
}

// markOf is c's mark after a visit that computed the view v (see
// connMark). An admitted shopper is never settled (its admission runs out
// with time), nor a shadowed connection (its place in the shadow queue
// moves with joins that change no input of the sale). Called with sr.mu
// held.
func (p *tickPlan) markOf(c *conn, v view) connMark {
	return connMark{
		settled: c.admittedAt == 0 && !c.shadow && v.state != StateAdmitted && v == c.last && (c.place >= 0 || !p.drawn),
		waiting: waits(v.state),
	}
}

// waits reports whether a connection in state counts as waiting.
func waits(state string) bool {
	return state == StateWaiting || state == StatePrequeue || state == StatePaused
}

// planTick is the tick's plan for the sale; it records the presence beat
// when one is due. Called with sr.mu held.
func (r *Room) planTick(sr *saleRoom, now time.Time, tick uint64, regular bool, competing int64) tickPlan {
	p := tickPlan{
		now: now, tick: tick, regular: regular,
		opens:       sr.sale.StartsAt.UnixMilli(),
		queue:       sr.sale.QueueOrder(),
		ttlMs:       r.ttl(sr.sale).Milliseconds(),
		pingSlots:   r.cfg.pingSlots(),
		statusSlots: uint64(max(1, r.cfg.StatusEvery/r.cfg.Tick)),
	}
	if b, ok := r.guard.(Blocker); ok {
		p.blocksGen = b.BlocksGen()
	}
	in := sr.inputs(now)
	p.still, sr.viewed = in == sr.viewed && p.blocksGen == sr.blocksGen, in
	p.drawn = sr.st.N >= 0
	p.hold = r.cfg.OpeningHold > 0 && now.UnixMilli() >= p.opens && now.Before(sr.sale.StartsAt.Add(r.cfg.OpeningHold))
	p.busy = p.hold || competingBusy(r.cfg.WaitingPushes, r.cfg.Tick, competing)
	// Every beatEvery; queue order has no capacity cap to free: no marks.
	p.beat = regular && r.cfg.AdmittedGrace > 0 && now.Sub(sr.lastBeat) >= r.cfg.beatEvery() && !p.queue
	if p.beat {
		sr.lastBeat = now
	}
	return p
}

// sweepOut is what the sweep found due, for the steps after it.
type sweepOut struct {
	admit   []*conn    // newly admitted: record, then the admitted message
	expired []*conn    // admission expired unused: back of the queue
	present []heldConn // admitted and connected: marked present
	ping    []*conn    // their ping slot came
	kick    []*conn    // blocked since they joined
	waited  int        // ping slots passed by (busy)
	held    int        // position updates held back by the opening hold
	waiting int        // connections waiting (WAITING, PREQUEUE, PAUSED)
	// WAITING statuses due, sent by sendDue: shoppers entering WAITING,
	// then position updates.
	entering, moved []dueStatus
}

// sweep sorts the connections of the sale into what they are due: every
// one, or on a still tick only the unsettled ones (the others' views
// cannot have changed) and the ping slot's. Statuses that are not paced
// are queued here; the paced WAITING ones are left in entering and moved.
// Called with sr.mu held.
func (r *Room) sweep(sr *saleRoom, p *tickPlan) sweepOut {
	s := sweepOut{entering: sr.entering[:0], moved: sr.moved[:0]}
	blocker, _ := r.guard.(Blocker)
	if p.still {
		if p.regular {
			for c := range sr.byPing[p.tick%p.pingSlots] {
				if sr.conns[c].settled {
					s.countPing(p, c) // the unsettled: in their visit
				}
			}
		}
		s.waiting = sr.settledWaiting
		for c := range sr.unsettled {
			r.visit(sr, p, &s, blocker, c)
		}
		return s
	}
	for c := range sr.conns {
		r.visit(sr, p, &s, blocker, c)
	}
	// Every connection was checked against this blocklist, unless the
	// kicks ran out: then the next ticks are not still, and check again.
	if len(s.kick) < maxKicksPerTick {
		sr.blocksGen = p.blocksGen
	}
	return s
}

// visit is the sweep of one connection: kicked if blocked, else sorted
// (sortConn). Called with sr.mu held.
func (r *Room) visit(sr *saleRoom, p *tickPlan, s *sweepOut, blocker Blocker, c *conn) {
	if blocker != nil && len(s.kick) < maxKicksPerTick && blocker.Blocked(c.ip, c.user) {
		s.kick = append(s.kick, c)
		return
	}
	sr.setMark(c, r.sortConn(sr, p, s, c))
}

// sortConn is the sweep of one connection that is not kicked; it returns
// the connection's mark. Called with sr.mu held.
func (r *Room) sortConn(sr *saleRoom, p *tickPlan, s *sweepOut, c *conn) connMark {
	s.countPing(p, c)
	if c.shadow {
		c.place = sr.shadowPlace(c.ticket, c.user)
	} else if c.place < 0 {
		if pl, ok := sr.place(c.ticket); ok {
			c.place = pl
		}
	}
	if p.present(c) {
		s.present = append(s.present, heldConn{user: c.user, place: c.place})
	}
	v := c.viewOf(sr, p.now)
	d := p.statusDue(c, v, len(s.expired) < maxRequeuePerTick)
	switch d {
	case dueAdmit:
		s.admit = append(s.admit, c)
		return connMark{}
	case dueRequeue:
		s.expired = append(s.expired, c)
		return connMark{}
	}
	r.sendMessage(sr, c)
	if waits(v.state) {
		s.waiting++
	}
	switch d {
	case dueEntering:
		s.entering = append(s.entering, dueStatus{c, v})
	case dueMoved:
		s.moved = append(s.moved, dueStatus{c, v})
	case dueHeld:
		s.held++
	case dueNow:
		c.last, c.lastTick = v, p.tick
		c.push(v, p.opens, nil)
	}
	return p.markOf(c, v)
}

// countPing takes c's ping if this tick is its slot. Called with sr.mu
// held.
func (s *sweepOut) countPing(p *tickPlan, c *conn) {
	switch p.pingDue(c) {
	case pingSend:
		s.ping = append(s.ping, c)
	case pingWait:
		s.waited++
	}
}

// pingVerdict is what a connection's ping slot asks of this tick.
type pingVerdict int

const (
	pingNone pingVerdict = iota // not its slot
	pingSend
	pingWait // its slot, passed by while busy: next period it is sent
)

// pingDue decides c's ping this tick: on a regular tick of its slot (by
// connection seq, so that few pings run at once), sent, or, while busy,
// passed by once but never twice in a row. Called with sr.mu held.
func (p *tickPlan) pingDue(c *conn) pingVerdict {
	if !p.regular || c.seq%p.pingSlots != p.tick%p.pingSlots {
		return pingNone
	}
	if p.busy && !c.pingWaited {
		c.pingWaited = true
		return pingWait
	}
	c.pingWaited = false
	return pingSend
}

// present reports whether c is marked present this tick: a beat is due,
// and its shopper is admitted, has not bought and its admission lives.
func (p *tickPlan) present(c *conn) bool {
	return p.beat && c.admittedAt != 0 && !c.bought && p.now.UnixMilli() < c.admittedAt+p.ttlMs
}

// due is what a connection's new view asks of this tick.
type due int

const (
	dueNothing  due = iota // nothing new, or a paced status not due yet
	dueAdmit               // the cursor reached it: record the admission
	dueRequeue             // its admission expired unused: back of the queue
	dueEntering            // entering WAITING: paced, sent first
	dueMoved               // a new position: paced
	dueHeld                // a new position held back by the opening hold
	dueNow                 // any other change: sent at once
)

// statusDue decides what c's view v asks. canRequeue is false once the
// tick's requeues are at their bound: an expired admission then waits,
// seen as the ADMITTED it was. A WAITING shopper whose chosen item sells
// out (or is back) is told at once, whatever the pacing: they may choose
// another.
func (p *tickPlan) statusDue(c *conn, v view, canRequeue bool) due {
	if v.state == StateAdmitted && c.admittedAt == 0 {
		return dueAdmit
	}
	if v.state == StateAdmitted && c.admittedAt != 0 && !c.bought && p.now.UnixMilli() >= c.admittedAt+p.ttlMs && canRequeue {
		return dueRequeue
	}
	if v == c.last {
		return dueNothing
	}
	if v.state != StateWaiting || v.chosenOut() != c.last.chosenOut() {
		return dueNow
	}
	switch {
	case c.last.state != StateWaiting:
		return dueEntering
	case p.tick-c.lastTick < p.statusSlots:
		return dueNothing
	case p.hold:
		return dueHeld
	}
	return dueMoved
}

// sendDue queues the paced WAITING statuses within budget (-1: no cap),
// the shoppers entering WAITING before the position updates and, within
// each, the front of the queue first. It returns how many it left for a
// later tick. Called with sr.mu held.
func sendDue(p *tickPlan, budget int, entering, moved []dueStatus) (deferred int) {
	for _, list := range [][]dueStatus{entering, moved} {
		if budget >= 0 && len(list) > budget {
			// With no budget left (a tick of many admissions, as at an
			// opening) there is nothing to pick.
			frontFirst(list, budget)
			deferred += len(list) - budget
			list = list[:budget]
		}
		for _, d := range list {
			d.c.last, d.c.lastTick = d.v, p.tick
			d.c.push(d.v, p.opens, nil)
		}
		if budget >= 0 {
			budget -= len(list)
		}
	}
	return deferred
}

// keepScratch keeps the sweep's due lists, emptied, for the next tick's
// sweep, so that a tick of tens of thousands of statuses allocates none.
// Called with sr.mu held.
func (sr *saleRoom) keepScratch(entering, moved []dueStatus) {
	clear(entering)
	clear(moved)
	sr.entering, sr.moved = entering[:0], moved[:0]
}

// afterSweep does what the sweep found due that needs no sale room lock:
// the pings and their counts, the kicks, the requeue of expired
// admissions and the presence marks.
func (r *Room) afterSweep(ctx context.Context, sr *saleRoom, s *sweepOut, now time.Time) {
	if s.waited > 0 {
		r.m.pings.WithLabelValues("waited").Add(float64(s.waited))
	}
	if len(s.ping) > 0 {
		r.m.pings.WithLabelValues("sent").Add(float64(len(s.ping)))
	}
	r.pingAll(s.ping)
	// Shoppers blocked after they joined lose their connection with BLOCKED
	// (a bounded number per tick: each close waits up to a second for the
	// error message to go out).
	for _, c := range s.kick {
		c.fail(errBlockedNow)
	}
	if len(s.expired) > 0 {
		r.requeueConns(ctx, sr, s.expired, now)
	}
	if len(s.present) > 0 {
		r.markPresent(ctx, sr.id, s.present, now)
	}
}

// admitConns records the admissions of conns with one script call (in
// queue order, with the items held for them) and queues each admitted
// message. An error is logged, and the next tick tries again: the
// connections are still due.
func (r *Room) admitConns(ctx context.Context, sr *saleRoom, p *tickPlan, conns []*conn) {
	users := make([]int64, len(conns))
	places := make([]int64, len(conns))
	for i, c := range conns {
		users[i], places[i] = c.user, c.place
	}
	at, err := admitUsers(ctx, r.rdb, sr.id, p.now.UnixMilli(), !p.queue, users, places)
	if err != nil {
		r.log.Warn("record admissions", "sale", sr.id, "err", err)
		return
	}
	heldItem := make([]int64, len(users))
	if p.queue {
		if heldItem, err = readHeldItems(ctx, r.rdb, sr.id, users); err != nil {
			r.log.Warn("read held items", "sale", sr.id, "err", err)
			return
		}
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	r.applyAdmissions(sr, p, conns, at, heldItem)
}

// applyAdmissions queues to each of conns what its recorded admission
// says: at[i] is the admission's time (0: none), heldItem[i] the item
// held for it in queue order. Called with sr.mu held.
func (r *Room) applyAdmissions(sr *saleRoom, p *tickPlan, conns []*conn, at, heldItem []int64) {
	for i, c := range conns {
		if at[i] == 0 && p.queue && c.chosen != 0 && c.admittedAt == 0 {
			// Passed over: the chosen item had no unit free at the turn.
			// The shopper keeps the place, next for that item.
			v := sr.passedView(c.chosen)
			if v != c.last {
				c.last, c.lastTick = v, p.tick
				c.push(v, p.opens, nil)
			}
			continue
		}
		if at[i] == 0 || c.admittedAt != 0 {
			continue
		}
		c.admittedAt, c.heldItem = at[i], heldItem[i]
		r.tally.waited(sr.id, p.now, c.joinedAt, at[i])
		v := view{state: StateAdmitted, out: sr.out}
		c.last = v
		c.push(v, p.opens, r.admittedMessage(sr, c.user, at[i], heldItem[i]))
	}
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

// dueStatus is a WAITING status due to a connection, held by the sweep
// until the tick's budget is known (sendDue).
type dueStatus struct {
	c *conn
	v view
}

const maxKicksPerTick = 64

var errBlockedNow = &flashsale.Error{Code: flashsale.CodeBlocked, Message: "access blocked"}
