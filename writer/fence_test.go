package writer

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/lua"
)

// A record of a lost Redis's reservation that lands past the rebuild's
// fence is refused, LOST_WITH_REDIS, and gives no unit back: the rebuild
// counted its unit as unsold. A record of the rebuilt Redis, landing after
// it, is written.
func TestFencedRecordIsRejectedWithoutAUnit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sale := e.newSale(t, 10)
	item := sale.Items[0]
	ctx := context.Background()
	r := e.start(t, Config{})
	kept := e.reserve(t, item, 1)
	e.publish(t, kept)
	waitHandled(t, r.w, 1)
	late := e.reserve(t, item, 2) // its record lands after the rebuild

	// Redis is lost and rebuilt from the database: 9 units, user 1's
	// order; the rebuild's fence stands at the topic's end.
	seen := time.UnixMilli(late.CreatedAtMs + 1)
	if err := e.rdb.Del(ctx, lua.StockKey(sale.ID), lua.BuyersKey(sale.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.stock.Restore(ctx, sale.ID, map[int64]int64{item.ID: 9},
		map[int64]redisstock.Buyer{1: {OrderID: kept.OrderID, ItemID: item.ID, CreatedAt: time.UnixMilli(kept.CreatedAtMs)}}); err != nil {
		t.Fatal(err)
	}
	log, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: e.kafka.Brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(log.Close)
	_, end, err := log.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := orderstore.New(e.pool).AddFence(ctx, sale.ID, []int64{item.ID}, orderstore.NewFence(seen, end)); err != nil {
		t.Fatal(err)
	}
	rebuilt := e.reserve(t, item, 3)
	rebuilt.CreatedAtMs = max(rebuilt.CreatedAtMs, seen.UnixMilli())
	e.publish(t, late, rebuilt)
	waitHandled(t, r.w, 3)

	rows := orderRows(t, e.pool, sale.ID)
	if got := rows[late.OrderID]; got.status != "REJECTED" || got.reason != ReasonLostWithRedis {
		t.Errorf("the lost Redis's late record: %s/%q, want REJECTED/%s", got.status, got.reason, ReasonLostWithRedis)
	}
	if got := rows[rebuilt.OrderID]; got.status != "PENDING" {
		t.Errorf("the rebuilt Redis's record: %s/%q, want PENDING", got.status, got.reason)
	}
	if got := sold(t, e.pool, item.ID); got != 2 {
		t.Errorf("sold %d, want 2", got)
	}
	waitFor(t, "the rejection's stock return settled", func() bool {
		var n int
		return e.pool.QueryRow(ctx, `SELECT count(*) FROM stock_returns`).Scan(&n) == nil && n == 0
	})
	left, err := e.stock.Remaining(ctx, sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	if left[item.ID] != 8 { // 9 rebuilt - 1 reserved by the rebuilt Redis; the late one gave nothing back
		t.Errorf("Redis remaining %d, want 8", left[item.ID])
	}
}
