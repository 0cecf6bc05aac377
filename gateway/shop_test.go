package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/flashsale/flashsale"
)

func TestParsePaymentBody(t *testing.T) {
	long := strings.Repeat("é", maxPaymentID)
	tests := []struct {
		name, body string
		want       paymentBody
		wantField  string // "" for success
	}{
		{name: "full", body: `{"paymentId":"pi_1","amountCents":1999,"currency":"EUR"}`, want: paymentBody{"pi_1", 1999, "EUR", ""}},
		{name: "with order", body: `{"paymentId":"p","amountCents":1,"currency":"JPY","orderId":"3F1C9A52-8C5E-4C57-9F0E-1D2B3C4D5E6F"}`, want: paymentBody{"p", 1, "JPY", "3f1c9a52-8c5e-4c57-9f0e-1d2b3c4d5e6f"}},
		{name: "bad order", body: `{"paymentId":"p","amountCents":1,"currency":"EUR","orderId":"7"}`, wantField: "orderId"},
		{name: "zero amount", body: `{"paymentId":"pi 2","amountCents":0,"currency":"USD"}`, want: paymentBody{"pi 2", 0, "USD", ""}},
		{name: "no currency", body: `{"paymentId":"pi 2","amountCents":0}`, wantField: "currency"},
		{name: "longest id", body: `{"paymentId":"` + long + `","amountCents":5,"currency":"EUR"}`, want: paymentBody{long, 5, "EUR", ""}},
		{name: "empty", body: ``, wantField: "request body"},
		{name: "not an object", body: `[1]`, wantField: "request body"},
		{name: "bad JSON", body: `{"paymentId":`, wantField: "malformed"},
		{name: "trailing data", body: `{"paymentId":"a","amountCents":1} {}`, wantField: "malformed"},
		{name: "unknown field", body: `{"paymentId":"a","amountCents":1,"userId":7}`, wantField: "userId"},
		{name: "no paymentId", body: `{"amountCents":1}`, wantField: "paymentId"},
		{name: "empty paymentId", body: `{"paymentId":"","amountCents":1}`, wantField: "paymentId"},
		{name: "paymentId too long", body: `{"paymentId":"` + long + `x","amountCents":1}`, wantField: "paymentId"},
		{name: "paymentId control", body: `{"paymentId":"a\nb","amountCents":1}`, wantField: "paymentId"},
		{name: "paymentId number", body: `{"paymentId":12,"amountCents":1}`, wantField: "paymentId"},
		{name: "no amount", body: `{"paymentId":"a"}`, wantField: "amountCents"},
		{name: "negative amount", body: `{"paymentId":"a","amountCents":-1}`, wantField: "amountCents"},
		{name: "fractional amount", body: `{"paymentId":"a","amountCents":19.99}`, wantField: "amountCents"},
		{name: "amount as string", body: `{"paymentId":"a","amountCents":"1999"}`, wantField: "amountCents"},
		{name: "lower-case currency", body: `{"paymentId":"a","amountCents":1,"currency":"eur"}`, wantField: "currency"},
		{name: "long currency", body: `{"paymentId":"a","amountCents":1,"currency":"EURO"}`, wantField: "currency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePaymentBody([]byte(tt.body))
			if tt.wantField == "" {
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid || !strings.Contains(flashsale.ErrorMessage(err), tt.wantField) {
				t.Fatalf("got %+v, %v; want INVALID naming %q", got, err, tt.wantField)
			}
		})
	}
}

// FuzzParsePaymentBody: any body is either refused with INVALID or gives
// a payment whose fields hold the documented rules, and which is what
// encoding/json reads from the same body.
func FuzzParsePaymentBody(f *testing.F) {
	for _, s := range []string{
		`{"paymentId":"pi_1","amountCents":1999,"currency":"EUR"}`, `{"paymentId":"x","amountCents":0}`,
		`{"paymentId":"","amountCents":1}`, `{"amountCents":1}`, `{"paymentId":"a\u0000","amountCents":1}`,
		`{"paymentId":"a","amountCents":1e3}`, `{"paymentId":"a","amountCents":99999999999999999999}`,
		`{"paymentId":"a","amountCents":1,"currency":null}`, `null`, `{}`, ` {"paymentId":"a","amountCents":1} `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parsePaymentBody(body)
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("parsePaymentBody(%q): %v, want INVALID", body, err)
			}
			return
		}
		n := utf8.RuneCountInString(got.PaymentID)
		if n < 1 || n > maxPaymentID || !utf8.ValidString(got.PaymentID) ||
			strings.ContainsFunc(got.PaymentID, func(r rune) bool { return !unicode.IsPrint(r) }) {
			t.Fatalf("parsePaymentBody(%q): paymentId %q breaks the rules", body, got.PaymentID)
		}
		if got.AmountCents < 0 {
			t.Fatalf("parsePaymentBody(%q): negative amount %d", body, got.AmountCents)
		}
		if !flashsale.ValidCurrency(got.Currency) {
			t.Fatalf("parsePaymentBody(%q): currency %q", body, got.Currency)
		}
		var ref struct {
			PaymentID   string `json:"paymentId"`
			AmountCents int64  `json:"amountCents"`
			Currency    string `json:"currency"`
			OrderID     string `json:"orderId"`
		}
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("parsePaymentBody(%q) accepted what encoding/json refuses: %v", body, err)
		}
		if ref.PaymentID != got.PaymentID || ref.AmountCents != got.AmountCents || ref.Currency != got.Currency ||
			!strings.EqualFold(ref.OrderID, got.OrderID) {
			t.Fatalf("parsePaymentBody(%q) = %+v, encoding/json reads %+v", body, got, ref)
		}
	})
}
