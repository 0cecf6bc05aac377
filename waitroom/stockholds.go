package waitroom

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisstock"
)

// StockHolds gives a room the stock's holds (Config.Holds) for sales
// allocated in queue order: the one adapter from Holds to redisstock,
// used by the wiring and by this package's tests alike.
type StockHolds struct{ Stock *redisstock.Store }

func (h StockHolds) Hold(ctx context.Context, saleID, itemID, userID int64, orderID string, until time.Time) error {
	return h.Stock.Hold(ctx, saleID, itemID, userID, orderID, until)
}

func (h StockHolds) HoldMany(ctx context.Context, saleID int64, reqs []HoldReq, until time.Time) ([]error, error) {
	rs := make([]redisstock.HoldReq, len(reqs))
	for i, r := range reqs {
		rs[i] = redisstock.HoldReq{ItemID: r.ItemID, UserID: r.UserID, OrderID: r.OrderID}
	}
	return h.Stock.HoldMany(ctx, saleID, rs, until)
}

func (h StockHolds) Held(ctx context.Context, saleID, userID int64) (int64, time.Time, bool, error) {
	return h.Stock.Held(ctx, saleID, userID)
}

func (h StockHolds) Lapse(ctx context.Context, saleID int64, now time.Time, limit int64) (int, error) {
	l, err := h.Stock.Lapse(ctx, saleID, now, limit)
	return len(l), err
}

func (h StockHolds) LapseAll(ctx context.Context, saleID int64) (int, error) {
	l, err := h.Stock.Lapse(ctx, saleID, redisstock.EndOfTime(), 0)
	return len(l), err
}

func (h StockHolds) ExtendHolds(ctx context.Context, saleID int64, pausedAt, resumedAt time.Time, window time.Duration) (int, error) {
	return h.Stock.ExtendHolds(ctx, saleID, pausedAt, resumedAt, window)
}

func (h StockHolds) HoldEnds(ctx context.Context, saleID int64) (map[int64]time.Time, error) {
	return h.Stock.HoldEnds(ctx, saleID)
}
