package waitroom

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flashsale/flashsale"
)

type joinReq struct {
	sale *flashsale.Sale
	user int64
	idk  string // the identity key, "" for none
	tier int    // the shopper's tier (0: none), kept for a tiered draw
	done chan joinRes
}

// ticketDuplicate is joinScript's ticket for a user whose identity key
// holds a place under another user.
const ticketDuplicate = -3

var errDuplicateIdentity = flashsale.Errorf(flashsale.CodeDuplicateIdentity,
	"this identity already holds a place in this sale under another account")

type joinRes struct {
	ticket joinTicket
	st     queueState
	err    error
}

var errStopped = errors.New("waitroom: room is not running")

// batcher collects joins for up to JoinBatchWindow (or MaxJoinBatch joins)
// and registers each batch with one script call per sale, on one of
// joinFlushers goroutines that live as long as it: a goroutine per batch
// would grow a new stack through the Redis client each time, and at a
// drop's arrival rate a batch holds one or two joins.
func (r *Room) batcher(ctx context.Context) {
	batches := make(chan []*joinReq)
	var wg sync.WaitGroup
	for range joinFlushers {
		wg.Go(func() {
			for batch := range batches {
				r.flushJoins(ctx, batch)
			}
		})
	}
	defer func() {
		close(batches)
		wg.Wait()
	}()
	for {
		var batch []*joinReq
		select {
		case <-ctx.Done():
			r.drainJoins()
			return
		case q := <-r.joins:
			batch = append(batch, q)
		}
		timer := time.NewTimer(r.cfg.JoinBatchWindow)
	collect:
		for len(batch) < r.cfg.MaxJoinBatch {
			select {
			case q := <-r.joins:
				batch = append(batch, q)
			case <-timer.C:
				break collect
			case <-ctx.Done():
				break collect
			}
		}
		timer.Stop()
		select {
		case batches <- batch:
		case <-ctx.Done():
			for _, q := range batch {
				q.done <- joinRes{err: errStopped}
			}
			r.drainJoins()
			return
		}
	}
}

// joinFlushers is how many join batches are in flight at once.
const joinFlushers = 4

func (r *Room) drainJoins() {
	for {
		select {
		case q := <-r.joins:
			q.done <- joinRes{err: errStopped}
		default:
			return
		}
	}
}

func (r *Room) flushJoins(ctx context.Context, batch []*joinReq) {
	bySale := map[int64][]*joinReq{}
	var order []int64
	for _, q := range batch {
		if bySale[q.sale.ID] == nil {
			order = append(order, q.sale.ID)
		}
		bySale[q.sale.ID] = append(bySale[q.sale.ID], q)
	}
	now := r.cfg.Now()
	for _, id := range order {
		qs := bySale[id]
		sr := r.saleRoom(id, true)
		r.firstCheck(ctx, sr)
		shadowIdk := r.shadows(ShadowIdentity)
		st, tickets, err := registerJoins(ctx, r.rdb, qs[0].sale, r.cfg.DrawLead, now.UnixMilli(), r.ttl(qs[0].sale).Milliseconds(), sr.knownNow(), shadowIdk, qs)
		if errors.Is(err, errStale) {
			// Redis lost the queue (or holds an older one): rebuild it,
			// then register the batch in the rebuilt queue.
			if err = r.restoreSale(ctx, id); err == nil {
				st, tickets, err = registerJoins(ctx, r.rdb, qs[0].sale, r.cfg.DrawLead, now.UnixMilli(), r.ttl(qs[0].sale).Milliseconds(), sr.knownNow(), shadowIdk, qs)
			}
		}
		for i, q := range qs {
			if err != nil {
				q.done <- joinRes{err: err}
				continue
			}
			if tickets[i].ticket == ticketDuplicate {
				q.done <- joinRes{err: errDuplicateIdentity}
				continue
			}
			q.done <- joinRes{ticket: tickets[i], st: st}
		}
	}
}

// register puts the user in the sale's queue (one batched script call) and
// returns the ticket and the sale room, loaded. A user whose identity key
// holds a place under another user is refused DUPLICATE_IDENTITY, or
// shadowed (shadowQueue's identity rule). A shadowed user's ticket is
// ticketShadowed, with the ticket shown. tier is the shopper's tier (0:
// none), as the access rule found it: a pre-queue ticket keeps it for a
// draw by tier.
func (r *Room) register(ctx context.Context, sale *flashsale.Sale, p flashsale.Principal, tier int) (joinTicket, *saleRoom, error) {
	userID := p.UserID
	sr := r.saleRoom(sale.ID, true)
	r.mu.Lock()
	reg := sr.registered
	sr.registered = true
	r.mu.Unlock()
	if !reg {
		if err := r.rdb.SAdd(ctx, activeKey, sale.ID).Err(); err != nil {
			r.mu.Lock()
			sr.registered = false
			r.mu.Unlock()
			return joinTicket{}, nil, fmt.Errorf("waitroom.register: %w", err)
		}
	}
	q := &joinReq{sale: sale, user: userID, idk: p.IdentityKey, tier: tier, done: make(chan joinRes, 1)}
	select {
	case r.joins <- q:
	case <-ctx.Done():
		return joinTicket{}, nil, ctx.Err()
	}
	var res joinRes
	select {
	case res = <-q.done:
	case <-ctx.Done():
		return joinTicket{}, nil, ctx.Err()
	}
	if res.err != nil {
		if errors.Is(res.err, errDuplicateIdentity) {
			r.tally.refused(sale.ID, r.cfg.Now(), RuleIdentity)
		}
		return joinTicket{}, nil, res.err
	}
	switch res.ticket.ticket {
	case ticketShadowedNew:
		res.ticket.ticket = ticketShadowed
		r.m.shadowed.WithLabelValues(ShadowIdentity).Inc()
		r.tally.shadowed(sale.ID, r.cfg.Now(), ShadowIdentity)
	case ticketShadowed:
	default:
		r.m.joined.Inc()
	}
	if err := r.ensureLoaded(ctx, sr, res.st); err != nil {
		return joinTicket{}, nil, err
	}
	return res.ticket, sr, nil
}

// ensureLoaded makes sure the sale room has read the sale's state once,
// then folds st in.
func (r *Room) ensureLoaded(ctx context.Context, sr *saleRoom, st queueState) error {
	sr.mu.Lock()
	loaded := sr.loaded
	sr.touched = r.cfg.Now()
	sr.mu.Unlock()
	if !loaded {
		if _, err := r.refresh(ctx, sr.id, r.cfg.Now()); err != nil {
			return err
		}
	}
	sr.mu.Lock()
	sr.observe(st)
	sale, st := sr.sale, sr.st
	sr.mu.Unlock()
	if sale == nil {
		// The sale left the cache between the join and its first
		// refresh (deleted, or a reload without it): nothing to show.
		return notFound()
	}
	return r.ensureDraw(ctx, sr, sale, st)
}
