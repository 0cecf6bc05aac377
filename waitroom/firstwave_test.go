package waitroom

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

// With a draw lead, the pre-queue closes and the draw runs before the
// opening; the first wave (stock × capacity factor places of the drawn
// order) is admitted at once with tokens that buy only from the opening
// instant; a join after the close queues behind the pre-queue; the draw is
// public from the close and verifies.
func TestFirstWaveBeforeOpening(t *testing.T) {
	e := newEnv(t)
	const lead = 5 * time.Second
	opens := e.clock.Now().Add(10 * time.Second)
	// rate 1/s: after the opening the rate alone would admit one place a
	// second; 3 units × factor 2 = a first wave of 6.
	sale := e.addSale(newSale(t, 81, opens, 1, 3))
	g := e.newGateway(Config{DrawLead: lead, CapacityFactor: 2}, nil)
	g.joinUsers(t, sale.ID, 10)
	ws := dial(t, g.url(sale.ID))
	ws.join(e.token(10)) // already in the pre-queue: keeps its ticket
	ws.untilState(StatePrequeue)
	if _, err := g.room.DrawRecord(context.Background(), sale); flashsale.ErrorCode(err) != flashsale.CodeNotDrawn {
		t.Fatalf("draw record before the close: %v, want NOT_DRAWN", err)
	}

	e.clock.Advance(10*time.Second - lead) // the close: opening − lead
	eventually(t, "the first wave", 10*time.Second, func() bool { return g.admitted(t, sale.ID) == 6 })
	// A join after the close queues first come, first served behind it.
	late, err := g.room.Join(context.Background(), flashsale.Principal{UserID: 11}, sale.ID, testIP, nil, "")
	if err != nil || late.State != StateWaiting || late.Position != 4 {
		t.Fatalf("join after the close: %+v, %v; want WAITING at position 4", late, err)
	}
	g.waitTicks(t, 3)
	if n := g.admitted(t, sale.ID); n != 6 {
		t.Fatalf("cursor at %d before the opening, want the first wave of 6 only", n)
	}

	users, frozen, err := PreQueue(context.Background(), e.rdb, sale.ID)
	if err != nil || !frozen || len(users) != 10 {
		t.Fatalf("pre-queue %v frozen %v, %v", users, frozen, err)
	}
	order := make([]int64, len(users))
	p := NewPermuter(sale.ShuffleSeed, uint64(len(users)))
	for i, u := range users {
		order[p.Place(uint64(i))] = u
	}
	for place, u := range order {
		st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: u}, sale.ID)
		if err != nil {
			t.Fatal(err)
		}
		if place >= 6 {
			if st.State != StateWaiting || st.Position != int64(place-6) {
				t.Fatalf("drawn place %d (user %d): %+v, want WAITING at %d", place, u, st, place-6)
			}
			continue
		}
		if st.State != StateAdmitted || st.NotBeforeMs != opens.UnixMilli() {
			t.Fatalf("drawn place %d (user %d): %+v, want ADMITTED from the opening", place, u, st)
		}
		if _, err := e.signer.Verify(st.AdmissionToken, u, sale.ID, e.clock.Now()); err == nil {
			t.Fatalf("user %d's first-wave token buys before the opening", u)
		}
		if _, err := e.signer.Verify(st.AdmissionToken, u, sale.ID, opens); err != nil {
			t.Fatalf("user %d's first-wave token at the opening: %v", u, err)
		}
	}
	// Over the WebSocket: the admitted message carries the not-before.
	if place := indexOf(order, 10); place < 6 {
		if m := ws.untilAdmitted(); m.NotBeforeMs != opens.UnixMilli() {
			t.Fatalf("admitted message %+v, want notBeforeMs %d", m, opens.UnixMilli())
		}
	}

	rec, err := g.room.DrawRecord(context.Background(), sale)
	if err != nil || rec.Seed == "" {
		t.Fatalf("draw record after the close: %+v, %v; want the seed", rec, err)
	}
	rep, err := VerifyDraw(context.Background(), e.rdb, sale)
	if err != nil || !rep.OK || rep.Checked != 6 {
		t.Fatalf("verify-draw: %+v, %v", rep, err)
	}

	// From the opening the rate goes on as without a lead: its credit
	// starts at the opening, within the cap (which the first wave fills
	// until stock is bought). The unit that raises the cap comes after
	// the opening: before it, a tick would admit the place it makes at
	// once, as part of the first wave.
	e.clock.Advance(lead + 500*time.Millisecond)
	g.waitTicks(t, 3)
	if n := g.admitted(t, sale.ID); n != 6 {
		t.Fatalf("cursor at %d half a second after the opening, want 6 (the cap is full)", n)
	}
	e.stock.set(sale.ID, sale.Items[0].ID, 4)
	e.clock.Advance(time.Second)
	eventually(t, "the rate after the opening", 10*time.Second, func() bool { return g.admitted(t, sale.ID) == 7 })
	g.waitTicks(t, 3)
	if n := g.admitted(t, sale.ID); n != 7 {
		t.Fatalf("cursor at %d after the opening, want 7 (cap 8, 1/s credit for 1.5 s)", n)
	}
	st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: order[6]}, sale.ID)
	if err != nil || st.State != StateAdmitted || st.NotBeforeMs != 0 {
		t.Fatalf("place 6 after the opening: %+v, %v; want ADMITTED with no not-before", st, err)
	}
}

// A paused sale issues no first wave: the draw happens, the cursor stays.
func TestPausedSaleNoFirstWave(t *testing.T) {
	e := newEnv(t)
	sale := newSale(t, 82, e.clock.Now().Add(10*time.Second), 1000, 3)
	sale.Paused = true
	e.addSale(sale)
	g := e.newGateway(Config{DrawLead: 5 * time.Second}, nil)
	g.joinUsers(t, sale.ID, 10)
	e.clock.Advance(6 * time.Second)
	eventually(t, "the draw", 10*time.Second, func() bool {
		_, frozen, err := PreQueue(context.Background(), e.rdb, sale.ID)
		return err == nil && frozen
	})
	g.waitTicks(t, 3)
	if n := g.admitted(t, sale.ID); n != 0 {
		t.Fatalf("a paused sale admitted %d before the opening", n)
	}
}

func indexOf(s []int64, v int64) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// The measured rate leaves out the first wave's jump at the draw: before
// the opening it is the configured rate, after it the admissions since.
func TestRateIgnoresTheFirstWave(t *testing.T) {
	opens := time.UnixMilli(10_000)
	sr := &saleRoom{sale: &flashsale.Sale{StartsAt: opens, AdmissionRatePerSecond: 7}}
	add := func(ms, serving int64) {
		sr.samples[sr.nsample%rateSamples] = struct{ ms, serving int64 }{ms, serving}
		sr.nsample++
	}
	add(6_000, 0)
	add(7_000, 500) // the draw: the first wave
	add(8_000, 500)
	if r := sr.rate(); r != 7 {
		t.Fatalf("rate before the opening %v, want the configured 7", r)
	}
	add(10_000, 500)
	add(11_000, 520)
	if r := sr.rate(); r != 20 {
		t.Fatalf("rate after the opening %v, want 20/s (the first wave left out)", r)
	}
}

// A first-wave not-before is the opening rounded up to the millisecond,
// so a purchase at it is never before the opening.
func TestNotBeforeRoundsUp(t *testing.T) {
	sale := &flashsale.Sale{StartsAt: time.UnixMilli(10_000).Add(300 * time.Microsecond)}
	if nb := notBefore(sale, 9_000); nb.UnixMilli() != 10_001 || nb.Before(sale.StartsAt) {
		t.Fatalf("not-before %v for an opening at %v", nb, sale.StartsAt)
	}
	exact := &flashsale.Sale{StartsAt: time.UnixMilli(10_000)}
	if nb := notBefore(exact, 9_000); !nb.Equal(exact.StartsAt) {
		t.Fatalf("not-before %v for an opening on the millisecond %v", nb, exact.StartsAt)
	}
	if nb := notBefore(exact, 10_000); !nb.IsZero() {
		t.Fatalf("an admission at the opening has not-before %v, want none", nb)
	}
}
