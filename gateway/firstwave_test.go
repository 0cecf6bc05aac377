package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

// A first-wave token (not-before = the opening) buys nothing before the
// opening, NOT_ADMITTED and no reservation, and buys at the opening; on an
// open sale a token whose not-before is ahead is refused the same way.
func TestPurchaseNotBefore(t *testing.T) {
	var nowMs atomic.Int64
	opens := testNow.Add(time.Hour) // sale 2, item 201
	nowMs.Store(opens.Add(-2 * time.Second).UnixMilli())
	e := newEnv(t, func(c *Config, _ *Deps) { c.Now = func() time.Time { return time.UnixMilli(nowMs.Load()) } })
	user := bearer(e.token(7, false))
	early := e.adm.Sign(flashsale.Admission{UserID: 7, SaleID: 2, ExpiresAt: opens.Add(5 * time.Minute), NotBefore: opens})
	ahead := e.adm.Sign(flashsale.Admission{UserID: 7, SaleID: 1, ExpiresAt: testNow.Add(5 * time.Hour), NotBefore: opens})

	buy := func(item, tok string) resp {
		return e.do("POST", "/api/flash-sales/items/"+item+"/purchase", "", "Authorization", user, HeaderAdmissionToken, tok)
	}
	for _, tt := range []struct{ name, item, tok string }{{"before the opening", "201", early}, {"not-before ahead on an open sale", "101", ahead}} {
		before := e.purchase.calls.Load()
		if r := buy(tt.item, tt.tok); r.status != 403 || r.errCode() != "NOT_ADMITTED" {
			t.Fatalf("%s: %d %s, want 403 NOT_ADMITTED", tt.name, r.status, r.body)
		}
		if e.purchase.calls.Load() != before {
			t.Fatalf("%s: reserved", tt.name)
		}
	}
	nowMs.Store(opens.UnixMilli())
	if r := buy("201", early); r.status != 202 {
		t.Fatalf("the first-wave token at the opening: %d %s, want 202", r.status, r.body)
	}
}

// The sale data carries the seed from the pre-queue's close (DrawLead
// before the opening), not before it.
func TestSeedPublicFromTheClose(t *testing.T) {
	var nowMs atomic.Int64
	opens := testNow.Add(time.Hour) // sale 2
	e := newEnv(t, func(c *Config, _ *Deps) {
		c.Now = func() time.Time { return time.UnixMilli(nowMs.Load()) }
		c.DrawLead = 3 * time.Second
	})
	seedShown := func() bool {
		var got map[string]any
		r := e.do("GET", "/api/flash-sales/sales/2", "")
		r.json(t, &got)
		_, ok := got["shuffleSeed"]
		return ok
	}
	nowMs.Store(opens.Add(-3*time.Second - time.Millisecond).UnixMilli())
	if seedShown() {
		t.Fatal("seed shown before the close")
	}
	nowMs.Store(opens.Add(-3 * time.Second).UnixMilli())
	if !seedShown() {
		t.Fatal("seed not shown from the close")
	}
}

// In queue order an admitted shopper's purchase claims the unit held for
// them (Claim, never Reserve), even when the item's sold-out flag is set
// (every unit may be held); in race order the flag answers 410 first.
func TestPurchaseQueueOrderClaims(t *testing.T) {
	e := newEnv(t)
	user := bearer(e.token(7, false))
	tok := e.adm.Sign(flashsale.Admission{UserID: 7, SaleID: 1, ExpiresAt: testNow.Add(time.Minute)})
	buy := func() resp {
		return e.do("POST", "/api/flash-sales/items/102/purchase", "", "Authorization", user, HeaderAdmissionToken, tok)
	}
	if r := buy(); r.status != 410 || e.purchase.claims.Load() != 0 {
		t.Fatalf("race order, item flagged sold out: %d %s (%d claims), want 410", r.status, r.body, e.purchase.claims.Load())
	}
	e.sales.sales[1].Allocation = flashsale.AllocationQueue
	before := e.purchase.calls.Load()
	if r := buy(); r.status != 202 || e.purchase.claims.Load() != 1 || e.purchase.calls.Load() != before {
		t.Fatalf("queue order: %d %s (%d claims, %d reserves), want 202 by one claim", r.status, r.body,
			e.purchase.claims.Load(), e.purchase.calls.Load()-before)
	}
	// Without a token: refused before any claim.
	if r := e.do("POST", "/api/flash-sales/items/102/purchase", "", "Authorization", user); r.status != 403 || e.purchase.claims.Load() != 1 {
		t.Fatalf("queue order without a token: %d %s, want 403 and no claim", r.status, r.body)
	}
}
