package waitroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/lua"
)

func notFound() error { return flashsale.Errorf(flashsale.CodeNotFound, "no such sale") }

// Join puts the caller in the sale's queue (the polling POST) and returns
// the status. A challenge from the JoinGuard comes back as a Status with
// Type "challenge" (and no error); the caller solves it and joins again
// with pow. code is the invitation code the shopper gave ("" none).
// Errors are *flashsale.Error (NOT_FOUND, BLOCKED, RATE_LIMITED, the
// access rule's refusals) or internal.
func (r *Room) Join(ctx context.Context, p flashsale.Principal, saleID int64, ip netip.Addr, pow json.RawMessage, code string) (_ Status, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	sale, ok := r.sales.Sale(saleID)
	if !ok {
		return Status{}, notFound()
	}
	var guardErr error
	if r.guard != nil {
		ch, err := r.guard.CheckJoin(ctx, ip, p.UserID, saleID, pow)
		var sh *flashsale.Shadow
		if err != nil && !errors.As(err, &sh) {
			r.guardRefused(saleID, err)
			return Status{}, err
		}
		if ch != nil {
			return Status{Type: TypeChallenge, Challenge: ch}, nil
		}
		guardErr = err
	}
	if rule := r.joinRule(guardErr, p, false); rule != "" {
		ticket, sr, shadowed, err := r.shadowJoin(ctx, sale, p.UserID, rule)
		if err != nil {
			return Status{}, err
		}
		if shadowed {
			return r.pollStatus(ctx, sr, p.UserID, ticket, true)
		}
	}
	tier, err := r.checkAccess(ctx, sale, p, code)
	if err != nil {
		return Status{}, err
	}
	ticket, sr, err := r.register(ctx, sale, p, tier)
	if err != nil {
		return Status{}, err
	}
	if ticket.ticket == ticketShadowed {
		return r.pollStatus(ctx, sr, p.UserID, ticket.shown, true)
	}
	return r.pollStatus(ctx, sr, p.UserID, ticket.ticket, false)
}

// Status is the caller's current status (the polling GET), with the
// admission token once admitted. A caller who has not joined gets
// NOT_FOUND.
func (r *Room) Status(ctx context.Context, p flashsale.Principal, saleID int64) (_ Status, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	if _, ok := r.sales.Sale(saleID); !ok {
		return Status{}, notFound()
	}
	// Loaded first: a gateway's first look at a sale may find the queue
	// lost from Redis and restore it (refresh), and the ticket with it.
	sr := r.saleRoom(saleID, true)
	if err := r.ensureLoaded(ctx, sr, queueState{N: -1}); err != nil {
		return Status{}, err
	}
	// A shadowed shopper may hold a ticket from before: the shadow
	// queue is what they see. Both records come in one round trip.
	uid := strconv.FormatInt(p.UserID, 10)
	pipe := r.rdb.Pipeline()
	shadowCmd := pipe.HGet(ctx, lua.QueueKey(saleID, keyShadow), uid)
	ticketCmd := pipe.HGet(ctx, lua.QueueKey(saleID, keyTickets), uid)
	_, _ = pipe.Exec(ctx) // each command's own error is read below
	if t, ok, err := shadowTicketOf(shadowCmd.Result()); err != nil || ok {
		if err != nil {
			return Status{}, err
		}
		return r.pollStatus(ctx, sr, p.UserID, t, true)
	}
	ticket, err := ticketCmd.Int64()
	if errors.Is(err, redis.Nil) {
		return Status{}, flashsale.Errorf(flashsale.CodeNotFound, "not in this sale's queue; join first")
	}
	if err != nil {
		return Status{}, fmt.Errorf("waitroom.Status: %w", err)
	}
	return r.pollStatus(ctx, sr, p.UserID, ticket, false)
}

// pollStatus builds the polling answer for one user.
func (r *Room) pollStatus(ctx context.Context, sr *saleRoom, userID, ticket int64, shadow bool) (Status, error) {
	now := r.cfg.Now()
	sr.mu.Lock()
	r.latestSale(sr)
	place := int64(-1)
	if shadow {
		place = sr.shadowPlace(ticket, userID)
	} else if p, ok := sr.place(ticket); ok {
		place = p
	}
	v := sr.viewOf(place, now)
	passed := sr.passedView(0)
	sale := sr.sale
	items := sr.items
	sr.mu.Unlock()
	st := Status{Type: TypeStatus, State: v.state, ServerTimeMs: now.UnixMilli(), OpensAtMs: sale.StartsAt.UnixMilli(),
		Position: v.position, EtaSeconds: v.eta, Message: saleMessage(sale), DrawSecret: r.MemberSecret(sr.id, userID)}
	if v.out != nil {
		ids := append([]int64{}, v.out.ids...)
		st.SoldOutItems = &ids
	}
	// chosen reports the shopper's choice (queue order, before the turn).
	chosen := func() error {
		if !sale.QueueOrder() || shadow {
			return nil
		}
		c, err := readChoice(ctx, r.rdb, sr.id, userID)
		if err != nil {
			return err
		}
		st.ChosenItemID = c
		st.ChosenSoldOut = view{chosen: c, out: v.out}.chosenOut()
		return nil
	}
	if v.state != StateAdmitted {
		if err := chosen(); err != nil {
			return Status{}, err
		}
		return st, nil
	}
	at, err := admitUsers(ctx, r.rdb, sr.id, now.UnixMilli(), !sale.QueueOrder(), []int64{userID}, []int64{place})
	if err != nil {
		return Status{}, err
	}
	if at[0] == 0 {
		// The cursor in Redis is behind our view: not yet; or, in queue
		// order, passed over for want of the chosen item: next for it.
		st.State, st.Position = StateWaiting, 0
		if sale.QueueOrder() {
			st.State = passed.state
		}
		if err := chosen(); err != nil {
			return Status{}, err
		}
		return st, nil
	}
	if now.UnixMilli() >= at[0]+r.ttl(sale).Milliseconds() {
		// The admission expired unused: to the back of the queue.
		tickets, _, err := r.requeue(ctx, sr, []int64{userID}, now)
		if err != nil {
			return Status{}, err
		}
		if t, ok := tickets[userID]; ok {
			if t.ticket == ticketShadowed {
				return r.pollStatus(ctx, sr, userID, t.shown, true)
			}
			return r.pollStatus(ctx, sr, userID, t.ticket, false)
		}
	}
	tok, exp, nb := r.token(sale, userID, at[0])
	st.AdmissionToken, st.ExpiresAtMs, st.NotBeforeMs, st.Items = tok, exp.UnixMilli(), unixMilli(nb), items
	if sale.QueueOrder() {
		held, err := readHeldItems(ctx, r.rdb, sr.id, []int64{userID})
		if err != nil {
			return Status{}, err
		}
		st.HoldUntilMs, st.HeldItemID, st.Items = st.ExpiresAtMs, held[0], heldItems(items, held[0])
	}
	return st, nil
}
