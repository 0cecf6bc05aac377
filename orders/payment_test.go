package orders_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/orders"
)

// TestShopPaidSignatures: an accepted callback's signature is kept, and
// forgotten once older than SignatureKeep (by the injected clock) when a
// later callback runs; a refusal that records nothing keeps none.
func TestShopPaidSignatures(t *testing.T) {
	f := newFixture(t, 1, 10)
	item := f.sale.Items[0]
	now := t0
	svc := f.service(f.stock, func() time.Time { return now })
	ctx := context.Background()
	count := func(sig string) int {
		t.Helper()
		var n int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM payment_signatures WHERE signature = $1`, sig).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	first := f.place(t, 100, item.ID, now.Add(-time.Minute), flashsale.OrderPending)
	pay := func(order, payment, sig string, amount int64) error {
		return svc.ShopPaid(ctx, flashsale.ShopPayment{OrderID: order, PaymentID: payment, AmountCents: amount, Signature: sig, SignedAt: now})
	}
	if err := pay(first, "p1", "sig-wrong-amount", item.PriceCents+1); flashsale.ErrorCode(err) != flashsale.CodeInvalid {
		t.Fatalf("wrong amount: %v", err)
	}
	if n := count("sig-wrong-amount"); n != 0 {
		t.Fatalf("a refused amount kept its signature")
	}
	if err := pay(first, "p1", "sig-1", item.PriceCents); err != nil {
		t.Fatal(err)
	}
	if err := pay(first, "p1", "sig-1", item.PriceCents); flashsale.ErrorCode(err) != flashsale.CodeReplayed {
		t.Fatalf("replay: %v", err)
	}
	if count("sig-1") != 1 || f.status(t, first) != flashsale.OrderPaid {
		t.Fatalf("signature kept %d times, order %s", count("sig-1"), f.status(t, first))
	}
	now = now.Add(orders.SignatureKeep + time.Second)
	second := f.place(t, 101, item.ID, now.Add(-time.Minute), flashsale.OrderPending)
	if err := pay(second, "p2", "sig-2", item.PriceCents); err != nil {
		t.Fatal(err)
	}
	if count("sig-1") != 0 || count("sig-2") != 1 {
		t.Fatalf("after %s: old signature kept %d, new %d; want 0 and 1", orders.SignatureKeep, count("sig-1"), count("sig-2"))
	}
}

// TestShopPaidOutcomes: what a provider's payment answers for an order in
// each state, the event it writes, and that a refusal moves no stock.
func TestShopPaidOutcomes(t *testing.T) {
	f := newFixture(t, 1, 20)
	item := f.sale.Items[0]
	ctx := context.Background()
	tests := []struct {
		name    string
		status  flashsale.OrderStatus
		created time.Time
		code    flashsale.Code
		event   string // type and reason of the event written, "" for none
	}{
		{"pending", flashsale.OrderPending, t0.Add(-time.Minute), "", "order.paid"},
		{"pending past its window", flashsale.OrderPending, t0.Add(-window - time.Second), flashsale.CodeOrderExpired, "payment.refused ORDER_EXPIRED PENDING"},
		{"expired", flashsale.OrderExpired, t0.Add(-window - time.Minute), flashsale.CodeOrderExpired, "payment.refused ORDER_EXPIRED EXPIRED"},
		{"cancelled", flashsale.OrderCancelled, t0.Add(-time.Minute), flashsale.CodeOrderCancelled, "payment.refused ORDER_CANCELLED CANCELLED"},
		{"rejected", flashsale.OrderRejected, t0.Add(-time.Minute), flashsale.CodeOrderCancelled, "payment.refused ORDER_CANCELLED REJECTED"},
		{"paid", flashsale.OrderPaid, t0.Add(-time.Minute), flashsale.CodeOrderPaid, "payment.refused DUPLICATE_PAYMENT PAID"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := f.place(t, int64(200+i), item.ID, tt.created, tt.status)
			rem, sold := f.remaining(t, item.ID), f.sold(t, item.ID)
			err := f.svc.ShopPaid(ctx, flashsale.ShopPayment{OrderID: id, PaymentID: "pay-" + id, AmountCents: item.PriceCents,
				Signature: "sig-" + id, SignedAt: t0})
			if got := flashsale.ErrorCode(err); got != tt.code {
				t.Fatalf("code %q (%v), want %q", got, err, tt.code)
			}
			var got string
			if err := f.pool.QueryRow(ctx, `SELECT string_agg(concat_ws(' ', type, body->>'reason', CASE WHEN type = 'payment.refused' THEN body->>'status' END), ',')
				FROM order_events WHERE order_id = $1 AND type IN ('order.paid', 'payment.refused')`, id).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tt.event {
				t.Fatalf("events %q, want %q", got, tt.event)
			}
			if tt.code == "" {
				if st := f.status(t, id); st != flashsale.OrderPaid {
					t.Fatalf("status %s, want PAID", st)
				}
			} else if st := f.status(t, id); st != tt.status {
				t.Fatalf("a refusal changed the status to %s", st)
			}
			if r, s := f.remaining(t, item.ID), f.sold(t, item.ID); r != rem || s != sold { // sold counts PENDING and PAID alike
				t.Fatalf("stock moved: remaining %d→%d, sold %d→%d", rem, r, sold, s)
			}
		})
	}
	t.Run("unknown", func(t *testing.T) {
		err := f.svc.ShopPaid(ctx, flashsale.ShopPayment{OrderID: "00000000-0000-4000-8000-000000000009", PaymentID: "x", Signature: "s-unknown", SignedAt: t0})
		if flashsale.ErrorCode(err) != flashsale.CodeNotFound {
			t.Fatalf("%v, want NOT_FOUND", err)
		}
	})
	t.Run("not yet stored", func(t *testing.T) {
		id := f.reserve(t, 300, item.ID, t0.Add(-time.Second))
		err := f.svc.ShopPaid(ctx, flashsale.ShopPayment{OrderID: id, PaymentID: "y", AmountCents: item.PriceCents, Signature: "s-early", SignedAt: t0})
		if flashsale.ErrorCode(err) != flashsale.CodeNotPayableYet {
			t.Fatalf("%v, want NOT_PAYABLE_YET", err)
		}
	})
}
