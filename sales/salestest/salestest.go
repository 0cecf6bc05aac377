// Package salestest creates sales for the tests of the components that work
// on stored sales (purchase, writer, orders, expiry).
package salestest

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/sales"
)

// Create stores a sale through store (so its stock is loaded into Redis)
// with one item per quantity: product 500+i at priceCents. It starts at
// startsAt with an admission rate of 100/s.
func Create(t testing.TB, store *sales.Store, startsAt time.Time, priceCents int64, quantities ...int64) flashsale.Sale {
	t.Helper()
	return CreateSharded(t, store, startsAt, priceCents, 1, quantities...)
}

// CreateSharded is Create for a sale whose stock is split over shards.
func CreateSharded(t testing.TB, store *sales.Store, startsAt time.Time, priceCents int64, shards int, quantities ...int64) flashsale.Sale {
	t.Helper()
	in := flashsale.Sale{Name: "test", StartsAt: startsAt, AdmissionRatePerSecond: 100, StockShards: shards}
	for i, q := range quantities {
		in.Items = append(in.Items, flashsale.Item{ProductID: int64(500 + i), Quantity: q, PriceCents: priceCents})
	}
	s, err := store.Create(context.Background(), in)
	if err != nil {
		t.Fatalf("create sale: %v", err)
	}
	return s
}
