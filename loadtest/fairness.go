package loadtest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/waitroom"
)

// FairnessReport says whether the queue's drawn order decided who bought
// (a run with Redis configured): in queue order every unit goes to the
// first Quantity places of the draw whose shoppers buy within their
// window; in race order fast clients behind them take units.
type FairnessReport struct {
	Units    int64 `json:"units"`    // acknowledged orders (202s)
	Shoppers int   `json:"shoppers"` // shoppers holding a place in the queue
	// OutOfRank is the units bought by shoppers outside the first
	// Quantity places of the queue (drawn places for the pre-queue, then
	// join order); Share is it over Units.
	OutOfRank int64   `json:"outOfRank"`
	Share     float64 `json:"share"`
	// FastUnits is the units bought by fast clients (Config.FastShare).
	FastUnits int64  `json:"fastUnits"`
	Error     string `json:"error,omitempty"`
}

// fairness ranks the buyers of the ledger by their place in the queue
// (waitroom.Places: the order from Redis, the seed from the public sale).
func fairness(ctx context.Context, cfg Config, hc *httpClient, base string, saleID, quantity int64, ledger []LedgerEntry, fast func(int64) bool) *FairnessReport {
	rep := &FairnessReport{}
	for _, e := range ledger {
		if e.Acknowledged {
			rep.Units++
		}
	}
	fail := func(err error) *FairnessReport {
		rep.Error = err.Error()
		return rep
	}
	rdb, err := redisconn.New(cfg.Redis)
	if err != nil {
		return fail(err)
	}
	defer rdb.Close()
	r, err := do(ctx, hc, http.MethodGet, fmt.Sprintf("%s/api/flash-sales/sales/%d", base, saleID), nil, nil)
	if err != nil {
		return fail(err)
	}
	var sale struct {
		Seed string `json:"shuffleSeed"`
	}
	if err := json.Unmarshal(r.Body, &sale); err != nil {
		return fail(fmt.Errorf("public sale: %w", err))
	}
	seed, err := hex.DecodeString(sale.Seed)
	if err != nil || len(seed) != 32 {
		return fail(fmt.Errorf("public sale: no seed (HTTP %d)", r.Status))
	}
	rank, err := waitroom.Places(ctx, rdb, saleID, seed)
	if err != nil {
		return fail(err)
	}
	rep.Shoppers = len(rank)
	for _, e := range ledger {
		if !e.Acknowledged {
			continue
		}
		if pl, ok := rank[e.UserID]; !ok || pl >= quantity {
			rep.OutOfRank++
		}
		if fast(e.UserID) {
			rep.FastUnits++
		}
	}
	if rep.Units > 0 {
		rep.Share = float64(rep.OutOfRank) / float64(rep.Units)
	}
	return rep
}
