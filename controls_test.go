package flashsale_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

func TestItemDetailsValidate(t *testing.T) {
	starts := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		item flashsale.Item
		want string // "" valid
	}{
		{"defaults", flashsale.Item{}, ""},
		{"all set", flashsale.Item{Name: "Trail runner", ImageURL: "https://cdn.example/a.png", Currency: "EUR"}, ""},
		{"http image", flashsale.Item{ImageURL: "http://cdn.example/a.png"}, "items[0].imageUrl: must be an absolute https:// URL"},
		{"site path", flashsale.Item{ImageURL: "/assets/sneaker.svg"}, ""},
		{"name at the limit", flashsale.Item{Name: strings.Repeat("n", flashsale.MaxItemNameLen)}, ""},
		{"long name", flashsale.Item{Name: strings.Repeat("n", flashsale.MaxItemNameLen+1)}, "items[0].name: at most 200 bytes"},
		{"blank name", flashsale.Item{Name: "  "}, "items[0].name: must not be blank"},
		{"control in name", flashsale.Item{Name: "a\nb"}, "items[0].name: must be UTF-8 text without control characters"},
		{"bad UTF-8 name", flashsale.Item{Name: "a\xffb"}, "items[0].name: must be UTF-8 text without control characters"},
		{"javascript image", flashsale.Item{ImageURL: "javascript:alert(1)"}, "items[0].imageUrl: must be an absolute"},
		{"protocol-relative image", flashsale.Item{ImageURL: "//evil.example/a.png"}, "items[0].imageUrl: must be an absolute"},
		{"backslash image", flashsale.Item{ImageURL: "/\\evil.example/a.png"}, "items[0].imageUrl: must be an absolute"},
		{"relative image", flashsale.Item{ImageURL: "a.png"}, "items[0].imageUrl: must be an absolute"},
		{"no host", flashsale.Item{ImageURL: "https:///a.png"}, "items[0].imageUrl: must be an absolute"},
		{"user info", flashsale.Item{ImageURL: "https://u:p@cdn.example/a.png"}, "items[0].imageUrl: must be an absolute"},
		{"space in image", flashsale.Item{ImageURL: "/assets/a b.png"}, "items[0].imageUrl: must be an absolute"},
		{"long image", flashsale.Item{ImageURL: "/" + strings.Repeat("a", flashsale.MaxImageURLLen)}, "items[0].imageUrl: at most 2048 bytes"},
		{"lower currency", flashsale.Item{Currency: "eur"}, "items[0].currency: must be an ISO 4217 code"},
		{"long currency", flashsale.Item{Currency: "EURO"}, "items[0].currency: must be an ISO 4217 code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			it := tc.item
			it.ProductID, it.Quantity, it.PriceCents = 501, 1, 1
			s := flashsale.Sale{Name: "n", StartsAt: starts, AdmissionRatePerSecond: 1, Items: []flashsale.Item{it}}
			err := s.Validate()
			if got := flashsale.ErrorMessage(err); (tc.want == "" && err != nil) || (tc.want != "" && !strings.HasPrefix(got, tc.want)) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
	d := flashsale.Item{ProductID: 501}.WithDefaults()
	if d.Name != "Product 501" || d.Currency != "USD" {
		t.Fatalf("defaults %+v", d)
	}
	if k := (flashsale.Item{ProductID: 1, Name: "x", Currency: "EUR"}).WithDefaults(); k.Name != "x" || k.Currency != "EUR" {
		t.Fatalf("defaults replaced given values: %+v", k)
	}
}

func TestSaleStatePausedAndEnded(t *testing.T) {
	starts := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	before, during := starts.Add(-time.Minute), starts.Add(time.Minute)
	for _, tc := range []struct {
		name    string
		sale    flashsale.Sale
		now     time.Time
		soldOut bool
		want    flashsale.SaleState
	}{
		{"paused open", flashsale.Sale{StartsAt: starts, Paused: true}, during, false, flashsale.SalePaused},
		{"paused sold out", flashsale.Sale{StartsAt: starts, Paused: true}, during, true, flashsale.SalePaused},
		{"paused before start", flashsale.Sale{StartsAt: starts, Paused: true}, before, false, flashsale.SalePaused},
		{"paused and ended", flashsale.Sale{StartsAt: starts, EndsAt: during, Paused: true}, during, false, flashsale.SaleEnded},
		{"ended before its start", flashsale.Sale{StartsAt: starts, EndsAt: before}, before, false, flashsale.SaleEnded},
		{"resumed", flashsale.Sale{StartsAt: starts}, during, false, flashsale.SaleOpen},
		{"resumed sold out", flashsale.Sale{StartsAt: starts}, during, true, flashsale.SaleSoldOut},
		{"scheduled", flashsale.Sale{StartsAt: starts}, before, false, flashsale.SaleScheduled},
	} {
		if got := tc.sale.State(tc.now, tc.soldOut); got != tc.want {
			t.Errorf("%s: State = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestParseMessage(t *testing.T) {
	for in, want := range map[string]string{
		"  hi  ": "hi",
		"":       "",
		" \t ":   "",
		strings.Repeat("ñ", flashsale.MaxMessageLen): strings.Repeat("ñ", flashsale.MaxMessageLen),
	} {
		if got, err := flashsale.ParseMessage(in); err != nil || got != want {
			t.Errorf("ParseMessage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{strings.Repeat("ñ", flashsale.MaxMessageLen+1), "a\x00b", "a\u0085b", "\xff"} {
		if _, err := flashsale.ParseMessage(in); flashsale.ErrorCode(err) != flashsale.CodeInvalid || !strings.HasPrefix(flashsale.ErrorMessage(err), "text: ") {
			t.Errorf("ParseMessage(%q) = %v, want INVALID about text", in, err)
		}
	}
}
