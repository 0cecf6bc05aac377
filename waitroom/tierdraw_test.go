package waitroom

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

// refTieredPlaces is an independent implementation of docs/DRAW.md "Tiers
// in the draw", written from the document: the tickets grouped by tier,
// tier 1 first and no tier last, each group in ticket order permuted by
// the v2 permutation keyed by HMAC-SHA256(seed, "flashsale/draw/tier/v1"
// || tier). It returns every ticket's place.
func refTieredPlaces(seed []byte, tiers string) []uint64 {
	groups := map[int][]int{} // tier → tickets in ticket order
	for i := 0; i < len(tiers); i++ {
		t := int(tiers[i] - '0')
		groups[t] = append(groups[t], i)
	}
	places := make([]uint64, len(tiers))
	var first uint64
	for _, t := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 0} {
		g := groups[t]
		if len(g) == 0 {
			continue
		}
		m := hmac.New(sha256.New, seed)
		m.Write([]byte("flashsale/draw/tier/v1"))
		m.Write([]byte{byte(t)})
		ts := m.Sum(nil)
		for j, ticket := range g {
			places[ticket] = first + refPlace(ts, uint64(len(g)), uint64(j))
		}
		first += uint64(len(g))
	}
	return places
}

// TestTieredDrawMatchesReference: the room's draw by tier gives every
// ticket the place the document's construction gives, the places are a
// permutation, every group takes its block of places in tier order, and a
// draw without tiers is the v2 permutation.
func TestTieredDrawMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for _, n := range []int{1, 2, 3, 17, 100, 1000} {
		seed := make([]byte, 32)
		for i := range seed {
			seed[i] = byte(rng.IntN(256))
		}
		var b strings.Builder
		for range n {
			// Mostly no tier, some of tiers 1, 2 and 9.
			b.WriteByte("0000123900"[rng.IntN(10)])
		}
		tiers := b.String()
		want := refTieredPlaces(seed, tiers)
		d := NewDraw(seed, uint64(n), true, []byte(tiers))
		seen := make([]bool, n)
		rank := func(c byte) int { // a group's order: tier 1 first, no tier last
			if c == '0' {
				return 10
			}
			return int(c - '0')
		}
		byPlace := make([]byte, n)
		for i := range n {
			p := d.Place(uint64(i))
			if p != want[i] {
				t.Fatalf("n %d ticket %d: place %d, the document gives %d", n, i, p, want[i])
			}
			if seen[p] {
				t.Fatalf("n %d: place %d taken twice", n, p)
			}
			seen[p] = true
			byPlace[p] = tiers[i]
		}
		for p := 1; p < n; p++ {
			if rank(byPlace[p]) < rank(byPlace[p-1]) {
				t.Fatalf("n %d: place %d (tier %c) after place %d (tier %c)", n, p, byPlace[p], p-1, byPlace[p-1])
			}
		}
		// TierBlocks (verify-draw's summary) names the same blocks.
		covered := 0
		for _, blk := range TierBlocks(tiers) {
			if blk.First != covered {
				t.Fatalf("n %d: block of tier %d starts at %d, want %d", n, blk.Tier, blk.First, covered)
			}
			for p := blk.First; p < blk.First+blk.Count; p++ {
				if TierOf(byPlace[p]) != blk.Tier {
					t.Fatalf("n %d: place %d holds tier %c, in the block of tier %d", n, p, byPlace[p], blk.Tier)
				}
			}
			covered += blk.Count
		}
		if covered != n {
			t.Fatalf("n %d: the blocks cover %d places", n, covered)
		}
		flat := NewDraw(seed, uint64(n), false, []byte(tiers))
		for i := range uint64(n) {
			if got := flat.Place(i); got != refPlace(seed, uint64(n), i) {
				t.Fatalf("n %d: untiered draw gives ticket %d place %d, v2 gives %d", n, i, got, refPlace(seed, uint64(n), i))
			}
		}
	}
	// Bytes that are not tier digits (Redis pads SETRANGE with zero
	// bytes) and tickets beyond the string are no tier.
	seed := []byte("0123456789abcdef0123456789abcdef")
	a, b := NewDraw(seed, 6, true, []byte("\x001\x00x")), NewDraw(seed, 6, true, []byte("010000"))
	for i := range uint64(6) {
		if a.Place(i) != b.Place(i) {
			t.Fatalf("ticket %d: %d with padding bytes, %d with digits", i, a.Place(i), b.Place(i))
		}
	}
}

// tierOf is the tests' tier of a user: every fourth from 4 tier 1, every
// fourth from 1 tier 2, every fourth from 2 tier 5, the rest none.
func tierOf(u int64) int {
	return [4]int{1, 2, 5, 0}[u%4]
}

// inTierOrder fails unless users 1..n (tierOf) hold places in tier order:
// every tier-1 place before every tier-2 place, and so on, no tier last.
func inTierOrder(t *testing.T, placeOf map[int64]int64, n int64) {
	t.Helper()
	for u := int64(1); u <= n; u++ {
		for v := int64(1); v <= n; v++ {
			if drawRank(tierOf(u)) < drawRank(tierOf(v)) && placeOf[u] > placeOf[v] {
				t.Fatalf("user %d (tier %d) at place %d, after user %d (tier %d) at %d", u, tierOf(u), placeOf[u], v, tierOf(v), placeOf[v])
			}
		}
	}
}

// drawRank is a tier's rank in a draw by tier (no tier last).
func drawRank(tier int) int {
	if tier == 0 {
		return flashsale.MaxTier + 1
	}
	return tier
}

// TestTieredDrawOrdersAdmission: a sale that draws by tier, shoppers of
// tiers 1, 2, 5 and none in its pre-queue (their tier from a trusted
// token claim, through the access gate), and late joiners after the
// close. The room admits every tier-1 shopper before any tier-2 shopper,
// and so on, no tier last, the late joiners after all of them in join
// order; the public record is version 3 with the tiers, and recomputing
// it alone gives every admitted place; VerifyDraw agrees. Joins after the
// close keep no tier.
func TestTieredDrawOrdersAdmission(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Hour)
	s := newSale(t, 61, opens, 100_000, 1000)
	s.Access = flashsale.SaleAccess{DrawByTier: true}
	sale := e.addSale(s)
	g := e.newGateway(Config{Gate: tokenTiers{}, DrawLead: 2 * time.Second}, nil)
	ctx := context.Background()
	const pre, late = 40, 6
	for u := int64(1); u <= pre; u++ {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u, Tier: tierOf(u)}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Hour - time.Second) // past the close (DrawLead)
	eventually(t, "the draw", 10*time.Second, func() bool {
		n, err := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyState), fieldN).Int64()
		return err == nil && n == pre
	})
	for u := int64(pre + 1); u <= pre+late; u++ {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u, Tier: 1}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second)
	eventually(t, "everyone admitted", 10*time.Second, func() bool {
		e.clock.Advance(100 * time.Millisecond)
		return g.admitted(t, sale.ID) >= pre+late
	})
	placeOf := map[int64]int64{}
	for u := int64(1); u <= pre+late; u++ {
		st, err := g.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
		if err != nil || st.AdmissionToken == "" {
			t.Fatalf("user %d: status %+v, %v", u, st, err)
		}
		adm, err := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyAdmitted), itoa(u)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if placeOf[u], _, err = parseAdmission(adm); err != nil {
			t.Fatal(err)
		}
	}
	inTierOrder(t, placeOf, pre)
	for u := int64(pre + 1); u <= pre+late; u++ {
		if want := u - 1; placeOf[u] != want {
			t.Fatalf("late joiner %d (tier 1 after the close): place %d, want %d (join order)", u, placeOf[u], want)
		}
	}

	rec, err := g.room.DrawRecord(ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Version != TieredDrawVersion || len(rec.Tiers) != pre {
		t.Fatalf("record: version %d, tiers %q", rec.Version, rec.Tiers)
	}
	chk, err := CheckDrawRecord(roundTrip(t, rec))
	if err != nil {
		t.Fatal(err)
	}
	for u := int64(1); u <= pre; u++ {
		ticket, ok := rec.FindMember(u, MemberSecret(g.room.cfg.DrawKey, sale.ID, u))
		if !ok {
			t.Fatalf("user %d not in the record", u)
		}
		if got := int(TierOf(rec.Tiers[ticket])); got != tierOf(u) {
			t.Fatalf("user %d: record's tier %d, joined with %d", u, got, tierOf(u))
		}
		if chk.Places[ticket] != placeOf[u] {
			t.Fatalf("user %d: the record gives place %d, admitted at %d", u, chk.Places[ticket], placeOf[u])
		}
	}
	// The same record read as version 2 would give other places: the
	// version is what makes an old verifier refuse it.
	old := rec
	old.Version = DrawRecordVersion
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseDrawRecord(bytes.NewReader(b), 1<<20); err == nil || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("a version 2 record with tiers: %v, want refused", err)
	}
	rep, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !rep.OK || !rep.Tiered || rep.Checked != pre+late {
		t.Fatalf("VerifyDraw = %+v, %v", rep, err)
	}
}

// TestTieredDrawSurvivesRedisLoss: a draw by tier frozen, checkpointed,
// then Redis flushed: the queue is restored from PostgreSQL with its
// tiers and the flag, so the places (VerifyDraw, the record, a new
// gateway's view) are the ones drawn before the loss.
func TestTieredDrawSurvivesRedisLoss(t *testing.T) {
	e := newEnv(t)
	pool := testenv.Postgres(t)
	opens := e.clock.Now().Add(time.Hour)
	s := newSale(t, 62, opens, 1, 2) // a first wave of 4 places
	s.Access = flashsale.SaleAccess{DrawByTier: true}
	sale := e.addSale(s)
	cfg := Config{Gate: tokenTiers{}, DrawLead: 2 * time.Second, Durable: NewPGDurable(pool), CheckpointEvery: 20 * time.Millisecond}
	g := e.newGateway(cfg, nil)
	ctx := context.Background()
	const pre = 24
	for u := int64(1); u <= pre; u++ {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u, Tier: tierOf(u)}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Hour - time.Second)
	eventually(t, "the draw and its first wave checkpointed", 10*time.Second, func() bool {
		st, found, err := NewPGDurable(pool).Saved(ctx, sale.ID)
		return err == nil && found && st.N == pre && st.Tiered && st.Seq == pre && st.Serving == 4
	})
	before, err := Places(ctx, e.rdb, sale.ID, sale.ShuffleSeed)
	if err != nil || len(before) != pre {
		t.Fatalf("Places before = %v, %v", before, err)
	}
	inTierOrder(t, before, pre)

	placesSurviveLoss(t, e, sale, before)
	// A gateway that never saw the draw reads it from the restored Redis.
	// The clock stands still before the opening: the cursor moves only by
	// one more first wave (the restore brings back no admission of a
	// polling shopper, so the cap counts 4 free places again), to 8.
	g2 := e.newGateway(Config{Gate: tokenTiers{}, DrawLead: 2 * time.Second}, nil)
	const serving = 8
	eventually(t, "the second first wave", 10*time.Second, func() bool {
		return g2.admitted(t, sale.ID) == serving
	})
	for u, p := range before {
		st, err := g2.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case p < serving && st.State != StateAdmitted:
			t.Fatalf("user %d at place %d, admitted (%d): %s on a new gateway", u, p, serving, st.State)
		case p >= serving && (st.State != StateWaiting || st.Position != p-serving):
			t.Fatalf("user %d at place %d: %s at position %d on a new gateway, want WAITING at %d", u, p, st.State, st.Position, p-serving)
		}
	}
	if now := g2.admitted(t, sale.ID); now != serving {
		t.Fatalf("the cursor moved from %d to %d while the clock stood still", serving, now)
	}
	rep, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !rep.OK || !rep.Tiered {
		t.Fatalf("VerifyDraw after the restore = %+v, %v", rep, err)
	}
}

// placesSurviveLoss empties the test's Redis, waits for the room to
// restore the sale's drawn queue (its pre-queue size, the tiered flag and
// every ticket of before's users), and fails unless every user of before
// holds the same place as before the loss.
func placesSurviveLoss(t *testing.T, e *env, sale *flashsale.Sale, before map[int64]int64) {
	t.Helper()
	ctx := context.Background()
	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	n := int64(len(before))
	eventually(t, "the queue restored", 10*time.Second, func() bool {
		v, err := e.rdb.HMGet(ctx, lua.QueueKey(sale.ID, keyState), fieldN, fieldTiered).Result()
		return err == nil && v[0] == itoa(n) && v[1] != nil &&
			e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyTickets)).Val() == n
	})
	after, err := Places(ctx, e.rdb, sale.ID, sale.ShuffleSeed)
	if err != nil {
		t.Fatal(err)
	}
	for u, p := range before {
		if after[u] != p {
			t.Fatalf("user %d (tier %d): place %d before the loss, %d after", u, tierOf(u), p, after[u])
		}
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// roundTrip sends a record through its wire format and parser.
func roundTrip(t *testing.T, rec DrawRecord) DrawRecord {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseDrawRecord(bytes.NewReader(b), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tokenTiers is a Gate that answers as access.Gate does for an open sale
// that draws by tier: the token's trusted tier, no refusal (the layout
// keeps the access package out of the room's tests; internal/wiring's
// tests drive the real one).
type tokenTiers struct{}

func (tokenTiers) Check(_ context.Context, _ *flashsale.Sale, p flashsale.Principal, _ string, _ time.Time) (int, error) {
	return p.Tier, nil
}

// TestTieredDrawRestoredFromConnections: a draw by tier with no
// checkpoint (no Durable), its shoppers on WebSockets with their tier in
// a trusted token claim; Redis is emptied after the draw. The gateway
// brings the queue back from its connections alone, their tiers and the
// draw's flag with them, and every shopper keeps the place drawn before
// the loss.
func TestTieredDrawRestoredFromConnections(t *testing.T) {
	e := newEnv(t)
	e.access = auth.NewVerifier(jwtSecret, auth.WithClock(e.clock.Now), auth.WithTierSigners(auth.TierSigners{Secret: true}))
	opens := e.clock.Now().Add(time.Hour)
	s := newSale(t, 63, opens, 1, 1) // a first wave of 2 places
	s.Access = flashsale.SaleAccess{DrawByTier: true}
	sale := e.addSale(s)
	g := e.newGateway(Config{Gate: tokenTiers{}, DrawLead: 2 * time.Second}, nil)
	ctx := context.Background()
	const pre = 12
	conns := map[int64]*client{}
	for u := int64(1); u <= pre; u++ {
		tok, err := auth.MintTier(jwtSecret, u, false, "", tierOf(u), time.Hour, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, g.url(sale.ID))
		c.join(tok)
		c.untilState(StatePrequeue)
		conns[u] = c
	}
	e.clock.Advance(time.Hour - time.Second) // the close
	eventually(t, "the draw", 10*time.Second, func() bool {
		v, err := e.rdb.HMGet(ctx, lua.QueueKey(sale.ID, keyState), fieldN, fieldTiered).Result()
		return err == nil && v[0] == itoa(pre) && v[1] != nil
	})
	before, err := Places(ctx, e.rdb, sale.ID, sale.ShuffleSeed)
	if err != nil || len(before) != pre {
		t.Fatalf("Places before = %v, %v", before, err)
	}
	inTierOrder(t, before, pre)

	placesSurviveLoss(t, e, sale, before)
	rep, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !rep.OK || !rep.Tiered {
		t.Fatalf("VerifyDraw after the restore = %+v, %v", rep, err)
	}
}
