package purchase

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
)

// A holder buys the unit held for them, even when the item is sold out
// for everyone else (the local sold-out flag set), and the order carries
// the claim's time; a shopper without a hold is NOT_ADMITTED, the wrong
// item INVALID, a second claim ALREADY_PURCHASED; after the window the
// claim is refused. When Kafka refuses the order, the unit is held again
// and the holder's retry buys it.
func TestClaimBuysTheHeldUnit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, 5)
	ctx := context.Background()
	clk := newClock(t0)
	rec := &recorder{}
	var fail bool
	pub := pubFunc(func(ctx context.Context, o flashsale.OrderPlaced) error {
		if fail {
			return errors.New("broker said no")
		}
		return rec.Publish(ctx, o)
	})
	s := New(Config{Now: clk.now}, e.st, pub, nil, nil)
	item, other := e.item(0), e.item(1)
	until := t0.Add(2 * time.Minute)
	orders := map[int64]string{}
	for _, u := range []int64{1, 2} {
		orders[u] = uuid.NewString()
		if err := e.st.Hold(ctx, e.sale.ID, item.ID, u, orders[u], until); err != nil {
			t.Fatal(err)
		}
	}
	// Everyone else meets SOLD_OUT, which sets the local flag.
	if _, err := s.Reserve(ctx, e.sale, item, 3); codeOf(err) != flashsale.CodeSoldOut || !s.SoldOut(item.ID) {
		t.Fatalf("reserve without a hold: %v (flag %v), want SOLD_OUT", err, s.SoldOut(item.ID))
	}

	clk.add(10 * time.Second)
	got, err := s.Claim(ctx, e.sale, item, 1)
	if err != nil || got != orders[1] {
		t.Fatalf("claim: %q, %v; want %s", got, err, orders[1])
	}
	if len(rec.got) != 1 || rec.got[0].OrderID != got || rec.got[0].CreatedAtMs != clk.now().UnixMilli() || rec.got[0].UserID != 1 {
		t.Fatalf("published %+v, want order %s of user 1 at %v", rec.got, got, clk.now())
	}
	if _, err := s.Claim(ctx, e.sale, item, 1); codeOf(err) != flashsale.CodeAlreadyPurchased {
		t.Fatalf("second claim: %v, want ALREADY_PURCHASED", err)
	}
	if _, err := s.Claim(ctx, e.sale, item, 3); codeOf(err) != flashsale.CodeNotAdmitted {
		t.Fatalf("claim without a hold: %v, want NOT_ADMITTED", err)
	}
	if _, err := s.Claim(ctx, e.sale, other, 2); codeOf(err) != flashsale.CodeInvalid {
		t.Fatalf("claim of another item: %v, want INVALID", err)
	}

	// Kafka refuses: the unit is held again for the rest of the window.
	fail = true
	if _, err := s.Claim(ctx, e.sale, item, 2); codeOf(err) != flashsale.CodeUnavailable {
		t.Fatalf("claim with Kafka refusing: %v, want UNAVAILABLE", err)
	}
	if n, err := e.st.HoldCount(ctx, e.sale.ID); err != nil || n != 1 {
		t.Fatalf("holds after the refused publish: %d, %v; want 1", n, err)
	}
	if r := e.remaining(t, item); r != 0 {
		t.Fatalf("remaining %d after the refused publish, want 0 (still held)", r)
	}
	fail = false
	if got, err := s.Claim(ctx, e.sale, item, 2); err != nil || got != orders[2] {
		t.Fatalf("retry: %q, %v; want %s", got, err, orders[2])
	}

	// A hold whose window is over is refused, and lapses back to stock.
	orders[4] = uuid.NewString()
	if err := e.st.Hold(ctx, e.sale.ID, other.ID, 4, orders[4], clk.now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	clk.add(time.Minute + time.Millisecond)
	if _, err := s.Claim(ctx, e.sale, other, 4); codeOf(err) != flashsale.CodeNotAdmitted {
		t.Fatalf("claim after the window: %v, want NOT_ADMITTED", err)
	}
	if l, err := e.st.Lapse(ctx, e.sale.ID, clk.now(), 0); err != nil || len(l) != 1 || l[0].UserID != 4 {
		t.Fatalf("lapse: %+v, %v; want user 4's hold", l, err)
	}
	if r := e.remaining(t, other); r != 5 {
		t.Fatalf("remaining of the other item %d, want 5", r)
	}
}

// While Redis has lost the sale's stock (the reconciler rebuilds it, and
// the room the holds after it), a holder's purchase finds no hold: it is
// answered 503 UNAVAILABLE, to try again, not NOT_ADMITTED, which would
// send the holder back in line.
func TestClaimWhileTheStockIsLostIsUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	s := New(Config{Now: newClock(t0).now}, e.st, &recorder{}, nil, nil)
	item := e.item(0)
	if err := e.st.Drop(ctx, e.sale.ID); err != nil {
		t.Fatal(err)
	}
	_, err := s.Claim(ctx, e.sale, item, 1)
	var fe *flashsale.Error
	if !errors.As(err, &fe) || fe.Code != flashsale.CodeUnavailable || fe.OrderID != "" {
		t.Fatalf("claim with the stock lost: %v, want UNAVAILABLE without an order", err)
	}
	if err := e.st.Load(ctx, e.sale.ID, map[int64]int64{item.ID: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, e.sale, item, 1); codeOf(err) != flashsale.CodeNotAdmitted {
		t.Fatalf("claim without a hold, the stock there: %v, want NOT_ADMITTED", err)
	}
}
