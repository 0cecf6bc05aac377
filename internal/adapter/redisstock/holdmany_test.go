package redisstock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

// HoldMany answers each hold as Hold would, in order: units while they
// last, then SOLD_OUT; a user who holds already is ALREADY_PURCHASED with
// the order's id.
func TestHoldMany(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ctx := context.Background()
			sale, item := int64(60+shards), int64(1001)
			st, _ := newShardedStore(t, sale, shards, map[int64]int64{item: 5})
			until := time.UnixMilli(1_800_000_000_000).Add(2 * time.Minute)
			var reqs []HoldReq
			for u := int64(1); u <= 7; u++ {
				reqs = append(reqs, HoldReq{ItemID: item, UserID: u, OrderID: newOrderID(t)})
			}
			reqs = append(reqs, HoldReq{ItemID: item, UserID: 1, OrderID: newOrderID(t)})
			got, err := st.HoldMany(ctx, sale, reqs, until)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range reqs[:5] {
				if got[i] != nil {
					t.Errorf("hold %d (user %d): %v, want a unit", i, r.UserID, got[i])
				}
			}
			for i := 5; i < 7; i++ {
				wantCode(t, fmt.Sprintf("hold %d, no unit left", i), got[i], flashsale.CodeSoldOut)
			}
			var fe *flashsale.Error
			if !errors.As(got[7], &fe) || fe.Code != flashsale.CodeAlreadyPurchased || fe.OrderID != reqs[0].OrderID {
				t.Errorf("user 1 again: %v, want ALREADY_PURCHASED naming %s", got[7], reqs[0].OrderID)
			}
			if n, err := st.HoldCount(ctx, sale); err != nil || n != 5 {
				t.Errorf("HoldCount %d, %v; want 5", n, err)
			}
			for _, r := range reqs[:5] {
				if it, end, ok, err := st.Held(ctx, sale, r.UserID); err != nil || !ok || it != item || !end.Equal(until) {
					t.Errorf("user %d: Held = %d %v %v %v; want item %d until %v", r.UserID, it, end, ok, err, item, until)
				}
			}
		})
	}
}
