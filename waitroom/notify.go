package waitroom

import (
	"context"
	"sync"
	"time"

	"github.com/flashsale/flashsale"
)

// Notifier is told of the shoppers a sale's leader admitted
// (*push.Sender, through the wiring). Admitted must not block: the
// leader calls it from its tick. users returns the admitted users; it
// reads Redis, so the notifier calls it on its own goroutine, and only
// when somebody in the sale asked to be told.
type Notifier interface {
	Admitted(saleID int64, users func(ctx context.Context) ([]int64, error))
}

// TurnLog is told of the turns a sale's leader saw come, with their
// places, how they came and when, by the leader's clock (*events.Shoppers,
// through the wiring, when the shop has a webhook). Turns must not block:
// the leader calls it from its tick. turns may read Redis; the log calls
// it on its own goroutine.
type TurnLog interface {
	Turns(saleID int64, kind flashsale.TurnKind, at time.Time, turns func(ctx context.Context) ([]flashsale.Turn, error))
}

// notifyPassed tells Config.Notify and Config.Turns of the places the
// cursor of a sale allocated in race order passed since this gateway's
// last look as its leader. The first look of a new leader tells nothing:
// the places before it were the previous leader's to tell, so a turn is
// told at most once (and not at all when the lease changed hands as the
// cursor passed it). Called with sr.mu held.
func (r *Room) notifyPassed(sr *saleRoom, sale *flashsale.Sale, leader bool, st queueState) {
	if !leader || (r.cfg.Notify == nil && r.cfg.Turns == nil) || sale.QueueOrder() {
		sr.notifiedTo = -1
		return
	}
	from, to := sr.notifiedTo, st.Serving
	if from >= 0 && to <= from {
		return
	}
	sr.notifiedTo = to
	if from < 0 {
		return
	}
	turns := func(ctx context.Context) ([]flashsale.Turn, error) {
		sr.allocMu.Lock()
		defer sr.allocMu.Unlock()
		users, err := r.placeUsers(ctx, sr, sale, st, from, to-from)
		if err != nil {
			return nil, err
		}
		var out []flashsale.Turn
		for i, u := range users {
			if u != 0 {
				out = append(out, flashsale.Turn{UserID: u, Place: from + int64(i)})
			}
		}
		return out, nil
	}
	r.tell(sale.ID, flashsale.TurnAdmitted, turns)
}

// tell hands turns to Config.Notify (the users) and Config.Turns. With
// both, they share one read of the turns (shareTurns).
func (r *Room) tell(saleID int64, kind flashsale.TurnKind, turns func(context.Context) ([]flashsale.Turn, error)) {
	if r.cfg.Notify != nil && r.cfg.Turns != nil {
		turns = shareTurns(turns)
	}
	if r.cfg.Notify != nil {
		r.cfg.Notify.Admitted(saleID, func(ctx context.Context) ([]int64, error) {
			ts, err := turns(ctx)
			users := make([]int64, len(ts))
			for i, t := range ts {
				users[i] = t.UserID
			}
			return users, err
		})
	}
	if r.cfg.Turns != nil {
		r.cfg.Turns.Turns(saleID, kind, r.cfg.Now(), turns)
	}
}

// notifyHeld tells Config.Notify and Config.Turns of the places an
// allocation pass of a sale allocated in queue order admitted: those
// whose admission record it wrote (a held unit; not a place whose
// shopper had bought before). The pass's script writes them once, for the
// lease's holder only.
func (r *Room) notifyHeld(saleID int64, admits []heldAdmit) {
	if r.cfg.Notify == nil && r.cfg.Turns == nil {
		return
	}
	var turns []flashsale.Turn
	for _, a := range admits {
		if a.atMs != 0 {
			turns = append(turns, flashsale.Turn{UserID: a.user, Place: a.place})
		}
	}
	if len(turns) == 0 {
		return
	}
	r.tell(saleID, flashsale.TurnHeld, func(context.Context) ([]flashsale.Turn, error) { return turns, nil })
}

// shareTurns returns read, called at most once with success: the first
// successful read is kept and handed to every later caller, so the push
// sender and the webhook's log read Redis once for one report. A failed
// read is not kept: the next caller reads again, under its own context,
// so one caller's cancelled context does not cost the other its turns.
// Callers must not modify the slice they get.
func shareTurns(read func(context.Context) ([]flashsale.Turn, error)) func(context.Context) ([]flashsale.Turn, error) {
	var mu sync.Mutex
	var got []flashsale.Turn
	done := false
	return func(ctx context.Context) ([]flashsale.Turn, error) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return got, nil
		}
		ts, err := read(ctx)
		if err != nil {
			return nil, err
		}
		got, done = ts, true
		return ts, nil
	}
}
