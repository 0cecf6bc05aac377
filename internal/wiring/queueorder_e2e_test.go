package wiring_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/waitroom"
)

// TestQueueOrderDecidesWhoBuys: 40 shoppers in the pre-queue of two sales
// of 10 units, one allocated in queue order (its stock over three shards),
// one in race order. At the
// opening the shoppers ranked 10-19 by the draw are fast clients that buy
// the instant they may; those ranked 0-9 are people who buy 1.5 s later.
//
//   - Queue order: each of ranks 0-9 is admitted before the opening with a
//     unit held for the claim window (holdUntilMs, heldItemId), and every
//     one of them who buys gets it, however much faster the fast clients
//     are (refused NOT_ADMITTED: no hold, no token). Rank 0 never buys:
//     when its window ends its unit goes to rank 10, who buys it.
//   - Race order (today's behaviour): the first wave is ranks 0-19, and
//     the fast clients take the units.
//
// Every answer is checked against docs/openapi.yaml.
func TestQueueOrderDecidesWhoBuys(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	s := apptest.Start(t, func(c *wiring.Config) { c.DrawLead = 2 * time.Second })
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	const shoppers, units, window = 40, 10, 10
	opens := time.Now().Add(5 * time.Second)
	type sale struct {
		id, item int64
		rank     map[int64]int // user → place
	}
	sales := map[string]*sale{}
	for _, mode := range []string{"queue", "race"} {
		// The queue sale's stock is split over three shards: holds
		// borrow from the other shards as reservations do.
		shards := map[string]int{"queue": 3, "race": 1}[mode]
		created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
			"name": mode + " order", "startsAt": opens.UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 1,
			"allocation": mode, "claimWindowSeconds": window, "stockShards": shards,
			"items": []map[string]any{{"productId": 501, "quantity": units, "priceCents": 1999}},
		})
		c.s.Want(created, 201, "")
		if created.Body["allocation"] != mode || created.Body["claimWindowSeconds"] != float64(window) {
			t.Fatalf("created %s", created.Raw)
		}
		sales[mode] = &sale{
			id:   int64(created.Body["id"].(float64)),
			item: int64(created.Body["items"].([]any)[0].(map[string]any)["id"].(float64)),
		}
	}
	user := func(i int) int64 { return int64(100 + i) }
	for _, sl := range sales {
		for i := range shoppers {
			c.s.Want(c.call(false, "POST", fmt.Sprintf("/api/flash-sales/sales/%d/queue", sl.id), s.Token(user(i), false), nil), 200, "")
		}
	}

	for _, sl := range sales {
		sl.rank = drawRanks(t, s, sl.id, shoppers)
	}
	byRank := func(sl *sale, r int) int64 {
		for u, rr := range sl.rank {
			if rr == r {
				return u
			}
		}
		t.Fatalf("no rank %d", r)
		return 0
	}
	// admission polls the shopper's status: its token (or "") and the
	// answer.
	admission := func(sl *sale, u int64) (string, apptest.Resp) {
		a := c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/queue", sl.id), s.Token(u, false), nil)
		c.s.Want(a, 200, "")
		tok, _ := a.Body["admissionToken"].(string)
		return tok, a
	}

	// Before the opening: in queue order exactly ranks 0-9 hold a unit,
	// until the opening plus the window.
	q := sales["queue"]
	tokens := map[string]map[int64]string{"queue": {}, "race": {}}
	waitFor(t, "the first wave's holds", func() bool {
		tok, _ := admission(q, byRank(q, units-1))
		return tok != ""
	})
	for r := range shoppers {
		u := byRank(q, r)
		tok, a := admission(q, u)
		if (tok != "") != (r < units) {
			t.Fatalf("queue order, rank %d: %s; want admitted only below rank %d", r, a.Raw, units)
		}
		if tok == "" {
			continue
		}
		tokens["queue"][u] = tok
		until, _ := a.Body["holdUntilMs"].(float64)
		nb, _ := a.Body["notBeforeMs"].(float64)
		if a.Body["heldItemId"] != float64(q.item) || int64(until) != int64(nb)+window*1000 || a.Body["expiresAtMs"] != until {
			t.Fatalf("queue order, rank %d: %s; want item %d held from the opening for %d s", r, a.Raw, q.item, window)
		}
	}
	rs := sales["race"]
	for r := range 2 * units {
		u := byRank(rs, r)
		waitFor(t, "the race's first wave", func() bool {
			tok, _ := admission(rs, u)
			tokens["race"][u] = tok
			return tok != ""
		})
	}
	if !time.Now().Before(opens) {
		t.Fatal("admitted only after the opening: the test proves nothing")
	}

	// The opening: fast clients (ranks 10-19) buy at once and until 1 s
	// later; people (ranks 1-9; rank 0 never buys) 1.5 s later.
	type result struct {
		mode   string
		rank   int
		status int
		code   string
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	buy := func(mode string, r int, at time.Time, until time.Time) {
		sl := sales[mode]
		u := byRank(sl, r)
		waitUntil(at) // the instant a client chose is what is tested
		tok := tokens[mode][u]
		if tok == "" {
			tok = "none" // a client without an admission sends whatever it has
		}
		for {
			got := c.call(false, "POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", sl.item), s.Token(u, false), nil,
				"X-Admission-Token", tok)
			code, _ := got.Body["error"].(string)
			if got.Status == 202 || got.Status == 410 || time.Now().After(until) {
				mu.Lock()
				results = append(results, result{mode, r, got.Status, code})
				mu.Unlock()
				return
			}
		}
	}
	for _, mode := range []string{"queue", "race"} {
		for r := units; r < 2*units; r++ {
			wg.Go(func() { buy(mode, r, opens, opens.Add(time.Second)) })
		}
		for r := 1; r < units; r++ {
			wg.Go(func() { buy(mode, r, opens.Add(1500*time.Millisecond), opens.Add(2500*time.Millisecond)) })
		}
	}
	wg.Wait()
	won := map[string][]int{}
	for _, r := range results {
		if r.status == 202 {
			won[r.mode] = append(won[r.mode], r.rank)
		} else if r.mode == "queue" && (r.rank < units || r.code != "NOT_ADMITTED") {
			t.Errorf("queue order, rank %d: %d %s; want 202 below rank %d, NOT_ADMITTED above", r.rank, r.status, r.code, units)
		}
	}
	for _, m := range won {
		sort.Ints(m)
	}
	t.Logf("bought: queue order ranks %v, race order ranks %v", won["queue"], won["race"])
	if fmt.Sprint(won["queue"]) != fmt.Sprint([]int{1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("queue order: ranks %v bought, want 1-9", won["queue"])
	}
	if len(won["race"]) != units || won["race"][units-1] < units {
		t.Fatalf("race order: ranks %v bought; want the fast clients (ranks ≥ %d) among the %d", won["race"], units, units)
	}

	// Rank 0's window ends unused: its unit goes to rank 10 at once, who
	// buys it.
	next := byRank(q, units)
	var tok string
	lookFrom := time.Now()
	waitFor(t, "the lapsed unit held for rank 10", func() bool {
		var a apptest.Resp
		tok, a = admission(q, next)
		return tok != "" && a.Body["heldItemId"] == float64(q.item)
	})
	if lapse := opens.Add(window * time.Second); time.Now().Before(lapse) {
		t.Fatalf("rank 10 held a unit at %v, before rank 0's window ended at %v", time.Now(), lapse)
	}
	t.Logf("rank 10 held the unit %v after the window's end (looked for from %v)", time.Since(opens.Add(window*time.Second)), lookFrom)
	c.s.Want(c.call(false, "POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", q.item), s.Token(next, false), nil,
		"X-Admission-Token", tok), 202, "")
	// Rank 0 has no unit now: NOT_ADMITTED, and it is back in line.
	first := byRank(q, 0)
	c.s.Want(c.call(false, "POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", q.item), s.Token(first, false), nil,
		"X-Admission-Token", tokens["queue"][first]), 403, "NOT_ADMITTED")
	waitFor(t, "rank 0 back in line", func() bool {
		_, a := admission(q, first)
		return a.Body["state"] == "WAITING" || a.Body["state"] == "SOLD_OUT"
	})
}

// drawRanks returns each pre-queued user's place in the sale's draw, from
// the pre-queue in Redis and the seed the sale publishes at the draw.
func drawRanks(t *testing.T, s *apptest.Stack, saleID int64, want int) map[int64]int {
	t.Helper()
	rdb, err := redisconn.New(redisconn.Config{URL: s.Config.RedisURL, Cluster: s.Config.RedisCluster})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var seed []byte
	waitFor(t, "the draw", func() bool {
		pub := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil)
		hexSeed, _ := pub.Body["shuffleSeed"].(string)
		seed, _ = hex.DecodeString(hexSeed)
		return len(seed) == 32
	})
	// The seed is public from the close by the clock; the pre-queue is
	// frozen at the leader's first tick after it.
	var users []int64
	waitFor(t, "the frozen pre-queue", func() bool {
		var frozen bool
		users, frozen, err = waitroom.PreQueue(context.Background(), rdb, saleID)
		if err != nil {
			t.Fatal(err)
		}
		return frozen
	})
	if len(users) != want {
		t.Fatalf("pre-queue of sale %d: %d users, want %d", saleID, len(users), want)
	}
	rank := map[int64]int{}
	for i, u := range users {
		rank[u] = int(waitroom.Permute(seed, uint64(len(users)), uint64(i)))
	}
	return rank
}

// TestQueueOrderAddedStockAndEnd: in queue order, stock the operator adds
// is held for the next in line at once, and ending the sale gives every
// hold back: the figures add up, and a holder's purchase after the end
// is refused. The stack's fleet clock is the test's, which jumps to the
// opening.
func TestQueueOrderAddedStockAndEnd(t *testing.T) {
	var clock jumpClock
	s := apptest.Start(t, func(c *wiring.Config) { c.Clock = clock.Now })
	op := s.Token(1, true)
	opens := clock.Now().Add(3 * time.Second)
	created := s.Do("POST", "/api/admin/sales", op, map[string]any{
		"name": "queue order", "startsAt": opens.UTC().Format(time.RFC3339Nano), "admissionRatePerSecond": 1,
		"allocation": "queue", "claimWindowSeconds": 600,
		"items": []map[string]any{{"productId": 501, "quantity": 2, "priceCents": 1999}},
	})
	s.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	item := int64(created.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	for u := int64(300); u < 305; u++ {
		s.Want(s.Do("POST", queue, s.Token(u, false), nil), 200, "")
	}
	rank := drawRanks(t, s, saleID, 5)
	byRank := map[int]int64{}
	for u, r := range rank {
		byRank[r] = u
	}
	token := func(u int64) string {
		a := s.Do("GET", queue, s.Token(u, false), nil)
		s.Want(a, 200, "")
		tok, _ := a.Body["admissionToken"].(string)
		return tok
	}
	figures := func() (remaining, sold float64) {
		g := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), op, nil)
		s.Want(g, 200, "")
		it := g.Body["items"].([]any)[0].(map[string]any)
		return it["remaining"].(float64), it["sold"].(float64)
	}
	waitFor(t, "ranks 0 and 1 holding", func() bool { return token(byRank[0]) != "" && token(byRank[1]) != "" })
	if token(byRank[2]) != "" {
		t.Fatal("rank 2 admitted with 2 units held by ranks 0 and 1")
	}
	// The opening, rounded up to the millisecond as the tokens' notBefore.
	clock.AdvanceTo(opens.Truncate(time.Millisecond).Add(time.Millisecond))
	purchase := fmt.Sprintf("/api/flash-sales/items/%d/purchase", item)
	s.Want(s.Do("POST", purchase, s.Token(byRank[0], false), nil, "X-Admission-Token", token(byRank[0])), 202, "")

	// One unit more: held for rank 2 at once, not for rank 3.
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/items/%d/stock", saleID, item), op, map[string]any{"add": 1}), 200, "")
	waitFor(t, "the added unit held for rank 2", func() bool { return token(byRank[2]) != "" })
	if token(byRank[3]) != "" {
		t.Fatal("rank 3 admitted: only one unit was added")
	}
	// Sold counts the orders in PostgreSQL, which the writer records a
	// moment after the purchase's 202.
	waitFor(t, "figures with two holds: remaining 0, sold 1", func() bool { rem, sold := figures(); return rem == 0 && sold == 1 })

	// The end gives both holds back.
	tok1 := token(byRank[1])
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/end", saleID), op, nil), 200, "")
	waitFor(t, "the holds given back", func() bool { rem, sold := figures(); return rem == 2 && sold == 1 })
	if r := s.Do("POST", purchase, s.Token(byRank[1], false), nil, "X-Admission-Token", tok1); r.Status == 202 {
		t.Fatalf("a holder bought after the end: %s", r.Raw)
	}
}
