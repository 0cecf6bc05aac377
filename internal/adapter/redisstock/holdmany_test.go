package redisstock

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// While RunPipeline runs, claims go through its pipelines, each answered
// as alone: 40 holders claim at once, on 1 and 3 shards; every claim
// buys its own hold and the pipelines carried them.
func TestClaimPipelined(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ctx := context.Background()
			sale, item := int64(70+shards), int64(1001)
			st, _ := newShardedStore(t, sale, shards, map[int64]int64{item: 40})
			t0 := time.UnixMilli(1_800_000_000_000)
			until := t0.Add(2 * time.Minute)
			orders := map[int64]string{}
			for u := int64(1); u <= 40; u++ {
				orders[u] = newOrderID(t)
				if err := st.Hold(ctx, sale, item, u, orders[u], until); err != nil {
					t.Fatal(err)
				}
			}
			runPipeline(t, st)
			_, before := st.PipelineStats()
			var wg sync.WaitGroup
			got := make([]string, 41)
			errs := make([]error, 41)
			for u := int64(1); u <= 40; u++ {
				wg.Go(func() { got[u], _, errs[u] = st.Claim(ctx, sale, item, u, t0.Add(time.Second)) })
			}
			wg.Wait()
			for u := int64(1); u <= 40; u++ {
				if errs[u] != nil || got[u] != orders[u] {
					t.Errorf("user %d: Claim = %q, %v; want %s", u, got[u], errs[u], orders[u])
				}
			}
			if _, after := st.PipelineStats(); after-before != 40 {
				t.Errorf("the pipelines carried %d claims, want 40", after-before)
			}
			if n, err := st.HoldCount(ctx, sale); err != nil || n != 0 {
				t.Errorf("HoldCount %d, %v after every claim; want 0", n, err)
			}
		})
	}
}
