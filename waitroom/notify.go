package waitroom

import (
	"context"

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

// notifyPassed tells Config.Notify of the places the cursor of a sale
// allocated in race order passed since this gateway's last look as its
// leader. The first look of a new leader tells nothing: the places before
// it were the previous leader's to tell, so a turn is told at most once
// (and not at all when the lease changed hands as the cursor passed it).
// Called with sr.mu held.
func (r *Room) notifyPassed(sr *saleRoom, sale *flashsale.Sale, leader bool, st queueState) {
	if !leader || r.cfg.Notify == nil || sale.QueueOrder() {
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
	r.cfg.Notify.Admitted(sale.ID, func(ctx context.Context) ([]int64, error) {
		sr.allocMu.Lock()
		defer sr.allocMu.Unlock()
		users, err := r.placeUsers(ctx, sr, sale, st, from, to-from)
		if err != nil {
			return nil, err
		}
		out := users[:0]
		for _, u := range users {
			if u != 0 {
				out = append(out, u)
			}
		}
		return out, nil
	})
}

// notifyHeld tells Config.Notify of the places an allocation pass of a
// sale allocated in queue order admitted: those whose admission record it
// wrote (a held unit; not a place whose shopper had bought before). The
// pass's script writes them once, for the lease's holder only.
func (r *Room) notifyHeld(saleID int64, admits []heldAdmit) {
	if r.cfg.Notify == nil {
		return
	}
	var users []int64
	for _, a := range admits {
		if a.atMs != 0 {
			users = append(users, a.user)
		}
	}
	if len(users) == 0 {
		return
	}
	r.cfg.Notify.Admitted(saleID, func(context.Context) ([]int64, error) { return users, nil })
}
