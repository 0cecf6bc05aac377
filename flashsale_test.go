package flashsale_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

func TestSaleValidate(t *testing.T) {
	starts := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	item := flashsale.Item{ProductID: 501, Quantity: 10, PriceCents: 1999}
	valid := func() flashsale.Sale {
		return flashsale.Sale{Name: "Winter drop", StartsAt: starts, AdmissionRatePerSecond: 5, Items: []flashsale.Item{item}}
	}
	tests := []struct {
		name   string
		change func(s *flashsale.Sale)
		want   string // the message; "" for a valid sale
	}{
		{"valid", func(s *flashsale.Sale) {}, ""},
		{"with end", func(s *flashsale.Sale) { s.EndsAt = starts.Add(time.Hour) }, ""},
		{"free item", func(s *flashsale.Sale) { s.Items[0].PriceCents = 0 }, ""},
		{"name at the limit", func(s *flashsale.Sale) { s.Name = strings.Repeat("n", flashsale.MaxSaleNameLen) }, ""},
		{"items at the limit", func(s *flashsale.Sale) {
			s.Items = make([]flashsale.Item, flashsale.MaxSaleItems)
			for i := range s.Items {
				s.Items[i] = item
			}
		}, ""},
		{"no name", func(s *flashsale.Sale) { s.Name = "" }, "name: required"},
		{"blank name", func(s *flashsale.Sale) { s.Name = " \t " }, "name: required"},
		{"long name", func(s *flashsale.Sale) { s.Name = strings.Repeat("n", flashsale.MaxSaleNameLen+1) }, "name: at most 200 bytes"},
		{"long with spaces", func(s *flashsale.Sale) { s.Name = " " + strings.Repeat("n", flashsale.MaxSaleNameLen) }, "name: at most 200 bytes"},
		{"no start", func(s *flashsale.Sale) { s.StartsAt = time.Time{} }, "startsAt: required (RFC 3339 time)"},
		{"end at start", func(s *flashsale.Sale) { s.EndsAt = starts }, "endsAt: must be after startsAt"},
		{"end before start", func(s *flashsale.Sale) { s.EndsAt = starts.Add(-time.Second) }, "endsAt: must be after startsAt"},
		{"rate zero", func(s *flashsale.Sale) { s.AdmissionRatePerSecond = 0 }, "admissionRatePerSecond: must be at least 1"},
		{"rate negative", func(s *flashsale.Sale) { s.AdmissionRatePerSecond = -5 }, "admissionRatePerSecond: must be at least 1"},
		{"one shard", func(s *flashsale.Sale) { s.StockShards = 1 }, ""},
		{"shards at the limit", func(s *flashsale.Sale) { s.StockShards = flashsale.MaxStockShards }, ""},
		{"too many shards", func(s *flashsale.Sale) { s.StockShards = flashsale.MaxStockShards + 1 }, "stockShards: must be 1 to 16"},
		{"negative shards", func(s *flashsale.Sale) { s.StockShards = -1 }, "stockShards: must be 1 to 16"},
		{"unknown allocation", func(s *flashsale.Sale) { s.Allocation = "lottery" }, `allocation: must be "queue" or "race"`},
		{"short claim window", func(s *flashsale.Sale) { s.ClaimWindow = 9 * time.Second }, "claimWindowSeconds: must be 10 to 3600 seconds"},
		{"long claim window", func(s *flashsale.Sale) { s.ClaimWindow = time.Hour + time.Second }, "claimWindowSeconds: must be 10 to 3600 seconds"},
		{"claim window in parts of a second", func(s *flashsale.Sale) { s.ClaimWindow = 10500 * time.Millisecond }, "claimWindowSeconds: must be 10 to 3600 seconds"},
		{"no items", func(s *flashsale.Sale) { s.Items = nil }, "items: at least one item required"},
		{"too many items", func(s *flashsale.Sale) {
			s.Items = make([]flashsale.Item, flashsale.MaxSaleItems+1)
		}, "items: at most 1000 items"},
		{"product zero", func(s *flashsale.Sale) { s.Items[0].ProductID = 0 }, "items[0].productId: must be at least 1"},
		{"quantity zero", func(s *flashsale.Sale) { s.Items[0].Quantity = 0 }, "items[0].quantity: must be at least 1"},
		{"negative price", func(s *flashsale.Sale) { s.Items[0].PriceCents = -1 }, "items[0].priceCents: must be 0 or more"},
		{"second item", func(s *flashsale.Sale) {
			s.Items = append(s.Items, flashsale.Item{ProductID: 502, Quantity: -1})
		}, "items[1].quantity: must be at least 1"},
		{"first fault wins", func(s *flashsale.Sale) { s.Name, s.AdmissionRatePerSecond = "", 0 }, "name: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := valid()
			tt.change(&s)
			err := s.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if got := flashsale.ErrorCode(err); got != flashsale.CodeInvalid {
				t.Errorf("code: got %q, want %q", got, flashsale.CodeInvalid)
			}
			if got := flashsale.ErrorMessage(err); got != tt.want {
				t.Errorf("message: got %q, want %q", got, tt.want)
			}
		})
	}
}
