package wiring

import (
	"context"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/waitroom"
)

// roomHolds gives the waiting room the stock's holds (waitroom.Holds) for
// sales allocated in queue order.
type roomHolds struct{ st *redisstock.Store }

func (h roomHolds) Hold(ctx context.Context, saleID, itemID, userID int64, orderID string, until time.Time) error {
	return h.st.Hold(ctx, saleID, itemID, userID, orderID, until)
}

func (h roomHolds) HoldMany(ctx context.Context, saleID int64, reqs []waitroom.HoldReq, until time.Time) ([]error, error) {
	rs := make([]redisstock.HoldReq, len(reqs))
	for i, r := range reqs {
		rs[i] = redisstock.HoldReq{ItemID: r.ItemID, UserID: r.UserID, OrderID: r.OrderID}
	}
	return h.st.HoldMany(ctx, saleID, rs, until)
}

func (h roomHolds) Held(ctx context.Context, saleID, userID int64) (int64, time.Time, bool, error) {
	return h.st.Held(ctx, saleID, userID)
}

func (h roomHolds) Lapse(ctx context.Context, saleID int64, now time.Time, limit int64) (int, error) {
	l, err := h.st.Lapse(ctx, saleID, now, limit)
	return len(l), err
}

func (h roomHolds) LapseAll(ctx context.Context, saleID int64) (int, error) {
	l, err := h.st.Lapse(ctx, saleID, redisstock.EndOfTime(), 0)
	return len(l), err
}

func (h roomHolds) ExtendHolds(ctx context.Context, saleID int64, pausedAt, resumedAt time.Time, window time.Duration) (int, error) {
	return h.st.ExtendHolds(ctx, saleID, pausedAt, resumedAt, window)
}

func (h roomHolds) HoldEnds(ctx context.Context, saleID int64) (map[int64]time.Time, error) {
	return h.st.HoldEnds(ctx, saleID)
}
