package wiring

import (
	"fmt"
	"net/url"
	"strings"
)

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
