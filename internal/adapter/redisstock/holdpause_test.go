package redisstock

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A pause extends each hold by the overlap of its window with the pause,
// once per pause however often it is applied: the hold's end, its buyer
// record's and pending member's time move together; a hold whose window
// ended before the pause, or starts after it, does not move; a claim
// after the old end and before the new one succeeds.
func TestExtendHoldsByPause(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			ctx := context.Background()
			sale, item := int64(60+shards), int64(1001)
			st, _ := newShardedStore(t, sale, shards, map[int64]int64{item: 10})
			users := usersHomedOn(300, 4, 0, max(shards, 1))
			const window = 2 * time.Minute
			t0 := time.UnixMilli(1_800_000_000_000)
			paused, resumed := t0.Add(time.Minute), t0.Add(4*time.Minute)
			// Ends: in the pause (window from t0), after it (from the
			// middle of the pause: extended by the part of the pause it
			// overlaps), before it, and after the resume (untouched).
			ends := []time.Time{t0.Add(window), paused.Add(time.Minute).Add(window), paused.Add(-time.Second), resumed.Add(window)}
			want := []time.Time{ends[0].Add(resumed.Sub(paused)), ends[1].Add(resumed.Sub(paused.Add(time.Minute))), ends[2], ends[3]}
			for i, u := range users {
				if err := st.Hold(ctx, sale, item, u, newOrderID(t), ends[i]); err != nil {
					t.Fatal(err)
				}
			}
			for pass := range 2 {
				n, err := st.ExtendHolds(ctx, sale, paused, resumed, window)
				if wantN := []int{2, 0}[pass]; err != nil || n != wantN {
					t.Fatalf("pass %d: extended %d, %v; want %d", pass, n, err, wantN)
				}
				got, err := st.HoldEnds(ctx, sale)
				if err != nil {
					t.Fatal(err)
				}
				for i, u := range users {
					if !got[u].Equal(want[i]) {
						t.Fatalf("pass %d: hold %d ends %v, want %v", pass, i, got[u], want[i])
					}
					b, ok, err := st.Buyer(ctx, sale, u)
					if err != nil || !ok || !b.CreatedAt.Equal(want[i]) {
						t.Fatalf("pass %d: buyer %d: %+v %v %v, want its time %v", pass, i, b, ok, err, want[i])
					}
				}
			}
			pend, err := st.PendingBefore(ctx, sale, want[0].Add(time.Millisecond), 100)
			if err != nil || len(pend) != 2 {
				t.Fatalf("pending up to the first new end: %+v %v, want the holds ending before the pause and at it", pend, err)
			}
			// The first holder claims after its old end, within the new one.
			if _, end, err := st.Claim(ctx, sale, item, users[0], ends[0].Add(time.Second)); err != nil || !end.Equal(want[0]) {
				t.Fatalf("claim after the old end: %v, %v; want the hold until %v", end, err, want[0])
			}
		})
	}
}
