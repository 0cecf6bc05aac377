package orders_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/orders"
)

// testSecret is a payment secret of the shortest accepted length.
const testSecret = "0123456789abcdef0123456789abcdef"

// TestVerifyPayment: the signature check's answers, bound to the order
// id, and one canonical signature for every header that passes for the
// same request.
func TestVerifyPayment(t *testing.T) {
	secret := []byte(testSecret)
	p := orders.NewPayments(secret, nil)
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"paymentId":"p","amountCents":1,"currency":"EUR"}`)
	const order, other = "0b8f9c52-8c1e-4f7e-9a51-3f6f2f1c9d10", "0b8f9c52-8c1e-4f7e-9a51-3f6f2f1c9d11"
	sig := events.SignFor(secret, now, order, body)
	canon, at, err := p.VerifyPayment(sig, order, body, now.Add(time.Minute))
	if err != nil || !at.Equal(now) || canon != sig {
		t.Fatalf("good signature: %q %v %v", canon, at, err)
	}
	// Spaced, upper-case hex, with an old secret's v1 beside it.
	v1 := strings.TrimPrefix(sig, "t=1800000000,v1=")
	old := strings.TrimPrefix(events.SignFor([]byte("old"), now, order, body), "t=1800000000,v1=")
	for _, h := range []string{"t=1800000000, v1=" + strings.ToUpper(v1), "v1=" + old + ",t=1800000000,v1=" + v1} {
		if c, _, err := p.VerifyPayment(h, order, body, now); err != nil || c != canon {
			t.Errorf("%q: %q %v, want %q", h, c, err, canon)
		}
	}
	for name, tc := range map[string]struct {
		header string
		order  string
		now    time.Time
		code   flashsale.Code
	}{
		"none":          {"", order, now, flashsale.CodeBadSignature},
		"malformed":     {"t=1800000000", order, now, flashsale.CodeBadSignature},
		"wrong":         {events.SignFor([]byte("guess"), now, order, body), order, now, flashsale.CodeBadSignature},
		"other order":   {sig, other, now, flashsale.CodeBadSignature},
		"unbound":       {events.Sign(secret, now, body), order, now, flashsale.CodeBadSignature},
		"late":          {sig, order, now.Add(5*time.Minute + time.Second), flashsale.CodeStaleSignature},
		"early":         {sig, order, now.Add(-5*time.Minute - time.Second), flashsale.CodeStaleSignature},
		"edge late":     {sig, order, now.Add(5 * time.Minute), ""},
		"edge early":    {sig, order, now.Add(-5 * time.Minute), ""},
		"no path order": {sig, "", now, flashsale.CodeBadSignature},
	} {
		_, _, err := p.VerifyPayment(tc.header, tc.order, body, tc.now)
		if got := flashsale.ErrorCode(err); got != tc.code {
			t.Errorf("%s: code %q (%v), want %q", name, got, err, tc.code)
		}
	}
}
