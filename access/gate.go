package access

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
)

// Gate checks a join against the sale's access rule. A plain open sale
// costs nothing; an open sale with tiers reads only the token's tier. For
// a codes or allowlist sale the Gate keeps, per sale, the allowlist and
// the bindings this gateway has seen, and drops them when the sale's
// version moves (an allowlist upload bumps it): PostgreSQL is asked on a
// first redemption, and for a shopper whose binding this gateway has not
// seen (one that redeemed on another gateway, or none).
type Gate struct {
	store *Store
	mu    sync.Mutex
	sales map[int64]*saleCache
}

// saleCache is what a Gate holds of one sale, at its version.
type saleCache struct {
	mu      sync.Mutex // held while loading, so one load per version
	version int64
	allow   map[int64]int8 // the allowlist; nil until loaded
	bound   map[int64]int8 // bindings seen
}

// NewGate returns a Gate over store.
func NewGate(store *Store) *Gate { return &Gate{store: store, sales: map[int64]*saleCache{}} }

// Check decides whether p may join sale at now, with code the invitation
// code the shopper gave ("" none), and returns the shopper's tier (0 for
// none). A refusal is NOT_INVITED, CODE_INVALID, CODE_USED or NOT_YET,
// and reserves, queues and (for a code) spends nothing.
func (g *Gate) Check(ctx context.Context, sale *flashsale.Sale, p flashsale.Principal, code string, now time.Time) (_ int, err error) {
	a := &sale.Access
	if a.Plain() {
		return 0, nil
	}
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	tier := p.Tier
	switch a.RuleName() {
	case flashsale.AccessAllowlist:
		t, err := g.listed(ctx, sale, p.UserID)
		if err != nil {
			return 0, fmt.Errorf("access.Check: %w", err)
		}
		tier = best(tier, t)
	case flashsale.AccessCodes:
		c := g.cache(sale)
		c.mu.Lock()
		t, ok := c.bound[p.UserID]
		c.mu.Unlock()
		if !ok {
			bt, err := g.store.binding(ctx, sale.ID, p.UserID)
			if err != nil {
				return 0, fmt.Errorf("access.Check: %w", err)
			}
			if bt != 0 {
				t, ok = int8(bt), true
				g.remember(c, p.UserID, bt)
			}
		}
		switch {
		case ok:
			tier = best(tier, int(t))
		case code != "":
			rt, err := g.store.redeem(ctx, sale.ID, p.UserID, code, func(ct int) error { return allowed(a, best(tier, ct), now) })
			if err != nil {
				if flashsale.ErrorCode(err) != flashsale.CodeInternal {
					return 0, err
				}
				return 0, fmt.Errorf("access.Check: %w", err)
			}
			g.remember(c, p.UserID, rt)
			tier = best(tier, rt)
		}
	}
	if err := allowed(a, tier, now); err != nil {
		return 0, err
	}
	return tier, nil
}

// allowed applies the rule's times to a shopper of tier (0: none) at now.
func allowed(a *flashsale.SaleAccess, tier int, now time.Time) error {
	if tier == 0 {
		pub := a.PublicFrom
		switch {
		case a.RuleName() != flashsale.AccessOpen && (pub.IsZero() || now.Before(pub)):
			return notInvited(a)
		case !pub.IsZero() && now.Before(pub):
			return flashsale.Errorf(flashsale.CodeNotYet, "this sale opens to everyone at %s; members join first", pub.UTC().Format(time.RFC3339))
		}
		return nil
	}
	if from := a.JoinFrom(tier); !from.IsZero() && now.Before(from) {
		return flashsale.Errorf(flashsale.CodeNotYet, "too early: tier %d may join from %s", tier, from.UTC().Format(time.RFC3339))
	}
	return nil
}

// notInvited is the refusal of a shopper the rule does not let in.
func notInvited(a *flashsale.SaleAccess) error {
	var until string
	if !a.PublicFrom.IsZero() {
		until = fmt.Sprintf(" until %s, when everyone may join", a.PublicFrom.UTC().Format(time.RFC3339))
	}
	if a.RuleName() == flashsale.AccessCodes {
		return flashsale.Errorf(flashsale.CodeNotInvited, "this sale needs an invitation code%s", until)
	}
	return flashsale.Errorf(flashsale.CodeNotInvited, "this sale is for invited shoppers only%s", until)
}

// best is the better (lower, non-zero) of two tiers.
func best(a, b int) int {
	if a == 0 || b != 0 && b < a {
		return b
	}
	return a
}

// cache returns the sale's cache at the sale's version, emptied when the
// version moved.
func (g *Gate) cache(sale *flashsale.Sale) *saleCache {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.sales[sale.ID]
	if !ok || c.version != sale.Version {
		// A newer version starts afresh; an older one (a gateway whose
		// sale cache lags) reads afresh too rather than undo a reload.
		c = &saleCache{version: sale.Version, bound: map[int64]int8{}}
		g.sales[sale.ID] = c
	}
	return c
}

func (g *Gate) remember(c *saleCache, user int64, tier int) {
	c.mu.Lock()
	c.bound[user] = int8(tier)
	c.mu.Unlock()
}

// listed returns the user's allowlist tier (0: not listed), loading the
// sale's list once per version.
func (g *Gate) listed(ctx context.Context, sale *flashsale.Sale, user int64) (int, error) {
	c := g.cache(sale)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.allow == nil {
		m, err := g.store.allowMap(ctx, sale.ID)
		if err != nil {
			return 0, err
		}
		c.allow = m
	}
	return int(c.allow[user]), nil
}
