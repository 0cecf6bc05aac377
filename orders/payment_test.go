package orders_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/orders"
)

// TestShopPaidSignatures: every verified callback's signature is kept,
// whatever the answer, so none is accepted twice; they are forgotten once
// older than SignatureKeep (by the injected clock) when a later callback
// runs.
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
		return svc.ShopPaid(ctx, flashsale.ShopPayment{OrderID: order, PaymentID: payment, AmountCents: amount, Currency: item.Currency,
			Signature: sig, SignedAt: now})
	}
	// Refusals keep their signature too: a replay of any is REPLAYED.
	for _, r := range []struct {
		name, order, sig string
		code             flashsale.Code
	}{
		{"wrong amount", first, "sig-wrong-amount", flashsale.CodePaymentMismatch},
		{"unknown order", "00000000-0000-4000-8000-000000000009", "sig-unknown", flashsale.CodeNotFound},
		{"malformed order", "nope", "sig-malformed", flashsale.CodeInvalid},
	} {
		amount := item.PriceCents
		if r.code == flashsale.CodePaymentMismatch {
			amount++
		}
		if err := pay(r.order, "p-"+r.sig, r.sig, amount); flashsale.ErrorCode(err) != r.code {
			t.Fatalf("%s: %v, want %s", r.name, err, r.code)
		}
		if err := pay(r.order, "p-"+r.sig, r.sig, amount); flashsale.ErrorCode(err) != flashsale.CodeReplayed {
			t.Fatalf("%s replayed: %v, want REPLAYED", r.name, err)
		}
		if n := count(r.sig); n != 1 {
			t.Fatalf("%s: signature kept %d times, want 1", r.name, n)
		}
	}
	if err := svc.SpendSignature(ctx, "sig-spent", now); err != nil {
		t.Fatal(err)
	}
	if err := svc.SpendSignature(ctx, "sig-spent", now); flashsale.ErrorCode(err) != flashsale.CodeReplayed {
		t.Fatalf("spent twice: %v, want REPLAYED", err)
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
	if count("sig-1") != 0 || count("sig-spent") != 0 || count("sig-2") != 1 {
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
		pay     func(*flashsale.ShopPayment)
	}{
		{"pending", flashsale.OrderPending, t0.Add(-time.Minute), "", "order.paid", nil},
		{"pending past its window", flashsale.OrderPending, t0.Add(-window - time.Second), flashsale.CodeOrderExpired, "payment.refused ORDER_EXPIRED PENDING", nil},
		{"expired", flashsale.OrderExpired, t0.Add(-window - time.Minute), flashsale.CodeOrderExpired, "payment.refused ORDER_EXPIRED EXPIRED", nil},
		{"cancelled", flashsale.OrderCancelled, t0.Add(-time.Minute), flashsale.CodeOrderCancelled, "payment.refused ORDER_CANCELLED CANCELLED", nil},
		{"rejected", flashsale.OrderRejected, t0.Add(-time.Minute), flashsale.CodeOrderCancelled, "payment.refused ORDER_CANCELLED REJECTED", nil},
		{"paid", flashsale.OrderPaid, t0.Add(-time.Minute), flashsale.CodeOrderPaid, "payment.refused DUPLICATE_PAYMENT PAID", nil},
		{"other currency", flashsale.OrderPending, t0.Add(-time.Minute), flashsale.CodePaymentMismatch, "payment.refused PAYMENT_MISMATCH PENDING",
			func(p *flashsale.ShopPayment) { p.Currency = "JPY" }},
		{"other amount", flashsale.OrderPending, t0.Add(-time.Minute), flashsale.CodePaymentMismatch, "payment.refused PAYMENT_MISMATCH PENDING",
			func(p *flashsale.ShopPayment) { p.AmountCents-- }},
		{"other currency, expired", flashsale.OrderExpired, t0.Add(-window - time.Minute), flashsale.CodePaymentMismatch, "payment.refused PAYMENT_MISMATCH EXPIRED",
			func(p *flashsale.ShopPayment) { p.Currency = "EUR" }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := f.place(t, int64(200+i), item.ID, tt.created, tt.status)
			rem, sold := f.remaining(t, item.ID), f.sold(t, item.ID)
			p := flashsale.ShopPayment{OrderID: id, PaymentID: "pay-" + id, AmountCents: item.PriceCents,
				Currency: item.Currency, Signature: "sig-" + id, SignedAt: t0}
			if tt.pay != nil {
				tt.pay(&p)
			}
			err := f.svc.ShopPaid(ctx, p)
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
		err := f.svc.ShopPaid(ctx, flashsale.ShopPayment{OrderID: id, PaymentID: "y", AmountCents: item.PriceCents, Currency: item.Currency,
			Signature: "s-early", SignedAt: t0})
		if flashsale.ErrorCode(err) != flashsale.CodeNotPayableYet {
			t.Fatalf("%v, want NOT_PAYABLE_YET", err)
		}
	})
}
