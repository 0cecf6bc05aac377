package waitroom

import (
	"context"
	"time"

	"github.com/flashsale/flashsale"
)

// Gate checks a join against the sale's access rule (*access.Gate): it
// returns the shopper's tier (0 none) or a refusal (NOT_INVITED,
// CODE_INVALID, CODE_USED, NOT_YET, UNAVAILABLE), after which nothing is
// queued. A plain open sale must cost it no I/O.
type Gate interface {
	Check(ctx context.Context, sale *flashsale.Sale, p flashsale.Principal, code string, now time.Time) (tier int, err error)
}

// checkAccess asks the Gate about a join, after the guard and before the
// queue, and counts a refusal in the sale's report. It returns the
// shopper's tier (0: none, and always 0 without a Gate).
func (r *Room) checkAccess(ctx context.Context, sale *flashsale.Sale, p flashsale.Principal, code string) (int, error) {
	if r.cfg.Gate == nil {
		return 0, nil
	}
	now := r.cfg.Now()
	tier, err := r.cfg.Gate.Check(ctx, sale, p, code, now)
	switch flashsale.ErrorCode(err) {
	case flashsale.CodeNotInvited, flashsale.CodeCodeInvalid, flashsale.CodeCodeUsed, flashsale.CodeNotYet:
		r.tally.refused(sale.ID, now, RuleAccess)
	}
	if err != nil {
		return 0, err
	}
	if tier < 0 || tier > flashsale.MaxTier {
		tier = 0
	}
	return tier, nil
}
