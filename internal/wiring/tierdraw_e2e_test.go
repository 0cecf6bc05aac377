package wiring_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/waitroom"
)

// TestTieredDrawEndToEnd: a sale of 3 units in queue order whose access
// draws by tier (codes of tiers 1 and 2, the public from before the
// close). Three tier-2 members join first, then three tier-1 members,
// then three shoppers of no tier. At the close the units are held for
// the three tier-1 members, the late joiners of the pre-queue; the others
// hold nothing. The public draw record is version 3 with each member's tier,
// and the places recomputed from it alone are the ones the room gives.
// Every answer is checked against openapi.yaml.
func TestTieredDrawEndToEnd(t *testing.T) {
	var clock jumpClock
	s := apptest.Start(t, func(c *wiring.Config) { c.DrawLead = 6 * time.Second; c.Clock = clock.Now })
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	opens := clock.Now().Add(20 * time.Second).Truncate(time.Second).UTC()
	created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
		"name": "members first", "startsAt": opens.Format(time.RFC3339), "admissionRatePerSecond": 100, "allocation": "queue",
		"access": map[string]any{"rule": "codes", "publicFrom": clock.Now().UTC().Format(time.RFC3339), "drawByTier": true,
			"tiers": []map[string]any{{"tier": 1}, {"tier": 2}}},
		"items": []map[string]any{{"productId": 501, "quantity": 3, "priceCents": 1999}},
	})
	s.Want(created, 201, "")
	if a, _ := created.Body["access"].(map[string]any); a == nil || a["drawByTier"] != true {
		t.Fatalf("created access %v, want drawByTier", created.Body["access"])
	}
	sale := int64(created.Body["id"].(float64))
	item := int64(created.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)
	codesOf := func(tier int) []string {
		gen := c.call(false, "POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), op, map[string]any{"count": 3, "tier": tier})
		s.Want(gen, 201, "")
		var out []string
		for _, x := range gen.Body["codes"].([]any) {
			out = append(out, x.(map[string]any)["code"].(string))
		}
		return out
	}
	tier1, tier2 := codesOf(1), codesOf(2)
	second := []int64{801, 802, 803} // tier 2, joining first
	first := []int64{811, 812, 813}  // tier 1
	public := []int64{821, 822, 823} // no tier
	for i, u := range second {
		s.Want(c.call(false, "POST", queue, s.Token(u, false), map[string]any{"code": tier2[i]}), 200, "")
	}
	for i, u := range first {
		s.Want(c.call(false, "POST", queue, s.Token(u, false), map[string]any{"code": tier1[i]}), 200, "")
	}
	for _, u := range public {
		s.Want(c.call(false, "POST", queue, s.Token(u, false), nil), 200, "")
	}

	clock.AdvanceTo(opens.Add(-6 * time.Second)) // the close
	secrets := map[int64]string{}
	for _, u := range first {
		st := testenv.EventuallyValue(t, fmt.Sprintf("tier-1 member %d's hold", u), 20*time.Second, func() (map[string]any, bool) {
			a := c.call(false, "GET", queue, s.Token(u, false), nil)
			s.Want(a, 200, "")
			return a.Body, a.Body["admissionToken"] != nil
		})
		if held, _ := st["heldItemId"].(float64); int64(held) != item {
			t.Fatalf("tier-1 member %d: %v, want a unit of item %d held", u, st, item)
		}
		secrets[u] = st["drawSecret"].(string)
	}
	// Every unit is held for tier 1: the others hold nothing and are told
	// the sale is sold out.
	for _, u := range append(append([]int64{}, second...), public...) {
		a := c.call(false, "GET", queue, s.Token(u, false), nil)
		s.Want(a, 200, "")
		if a.Body["state"] != "SOLD_OUT" || a.Body["admissionToken"] != nil || a.Body["heldItemId"] != nil {
			t.Fatalf("shopper %d: %v, want SOLD_OUT with nothing held", u, a.Body)
		}
		secrets[u] = a.Body["drawSecret"].(string)
	}

	rec := testenv.EventuallyValue(t, "the draw record", 20*time.Second, func() (apptest.Resp, bool) {
		d := c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/draw", sale), "", nil)
		return d, d.Status == 200
	})
	record, err := waitroom.ParseDrawRecord(bytes.NewReader(rec.Raw), 1<<20)
	if err != nil {
		t.Fatalf("draw record %s: %v", rec.Raw, err)
	}
	if record.Version != waitroom.TieredDrawVersion || record.Tiers == "" {
		t.Fatalf("draw record version %d tiers %q, want version 3 with tiers", record.Version, record.Tiers)
	}
	check, err := waitroom.CheckDrawRecord(record)
	if err != nil || record.PreQueueSize != 9 {
		t.Fatalf("draw record: %+v %v, want 9 drawn", check, err)
	}
	want := func(users []int64, tier uint8, lo int64) {
		t.Helper()
		for _, u := range users {
			sec, err := waitroom.ParseMemberSecret(secrets[u])
			if err != nil {
				t.Fatal(err)
			}
			ticket, ok := record.FindMember(u, sec)
			if !ok {
				t.Fatalf("shopper %d is not in the draw record", u)
			}
			if got := waitroom.TierOf(record.Tiers[ticket]); got != tier {
				t.Fatalf("shopper %d: the record's tier %d, want %d", u, got, tier)
			}
			if p := check.Places[ticket]; p < lo || p > lo+2 {
				t.Fatalf("shopper %d (tier %d): place %d from the record, want %d..%d", u, tier, p, lo, lo+2)
			}
		}
	}
	want(first, 1, 0)
	want(second, 2, 3)
	want(public, 0, 6)
}
