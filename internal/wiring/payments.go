package wiring

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/orders"
)

// PaymentSignatureWindow is how far a payment callback's signing time may
// be from the gateway's clock, either way (CONTRACT section 5).
const PaymentSignatureWindow = 5 * time.Minute

// checkPaymentURL checks FLASHSALE_PAYMENT_URL: an absolute http(s) URL
// with {orderId} where the order id goes.
func checkPaymentURL(v string) error {
	u, err := url.Parse(strings.ReplaceAll(v, "{orderId}", "x"))
	switch {
	case err != nil:
		return fmt.Errorf("FLASHSALE_PAYMENT_URL=%q: %w", v, err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("FLASHSALE_PAYMENT_URL=%q: want an absolute http or https URL like https://shop.example/pay/{orderId}", v)
	case !strings.Contains(v, "{orderId}"):
		return fmt.Errorf("FLASHSALE_PAYMENT_URL=%q: want {orderId} where the order id goes, like https://shop.example/pay/{orderId}", v)
	}
	return nil
}

// shopPayments is the gateway's ShopPayments: the signature check under
// FLASHSALE_PAYMENT_SECRET, and the order service's record of the
// payment.
type shopPayments struct {
	secret []byte
	orders *orders.Service
}

var (
	errBadSignature   = flashsale.Errorf(flashsale.CodeBadSignature, "missing, malformed or wrong X-Flashsale-Signature")
	errStaleSignature = flashsale.Errorf(flashsale.CodeStaleSignature, "the signature's timestamp is more than 5 minutes from the server's clock; sign the request anew")
)

// VerifyPayment checks the signature with events.VerifyFor, bound to the
// path's order id. The canonical signature is the one this secret makes
// of (t, order id, body): any header that passes for the same request,
// however spaced or with however many v1 parts, names the same replay.
func (p shopPayments) VerifyPayment(header, orderID string, body []byte, now time.Time) (string, time.Time, error) {
	at, err := events.VerifyFor(p.secret, header, orderID, body, now, PaymentSignatureWindow)
	switch {
	case errors.Is(err, events.ErrSignatureStale):
		return "", time.Time{}, errStaleSignature
	case err != nil:
		return "", time.Time{}, errBadSignature
	}
	return events.SignFor(p.secret, at, orderID, body), at, nil
}

func (p shopPayments) ShopPaid(ctx context.Context, sp flashsale.ShopPayment) error {
	return p.orders.ShopPaid(ctx, sp)
}

func (p shopPayments) SpendSignature(ctx context.Context, sig string, signedAt time.Time) error {
	return p.orders.SpendSignature(ctx, sig, signedAt)
}
