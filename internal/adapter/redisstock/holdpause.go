package redisstock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/lua"
)

// extendScript is lua.HoldExtend.
var extendScript = redis.NewScript(lua.HoldExtend)

// ExtendHolds adds the overlap of each hold's window with the pause
// [pausedAt, resumedAt) to the hold (its end, and the time of its buyer
// record and pending member), on every shard of the sale. Each shard
// applies a given pause once (its marker holds the pause's start), so a
// call repeated after a failure halfway, by this leader or the next,
// extends nothing twice. It returns the number of holds extended by this
// call.
func (s *Store) ExtendHolds(ctx context.Context, saleID int64, pausedAt, resumedAt time.Time, window time.Duration) (int, error) {
	n := 0
	for _, tag := range s.tags(saleID) {
		keys := []string{lua.ShardKey(tag, lua.KindHolds), lua.ShardKey(tag, lua.KindBuyers),
			lua.ShardKey(tag, lua.KindPending), lua.ShardKey(tag, lua.KindHoldPause)}
		k, err := extendScript.Run(ctx, s.rdb, keys, pausedAt.UnixMilli(), resumedAt.UnixMilli(), window.Milliseconds()).Int()
		if err != nil {
			return n, fmt.Errorf("redisstock.ExtendHolds: %w", err)
		}
		n += k
	}
	return n, nil
}

// HoldEnds returns the end of every hold of the sale not yet claimed or
// lapsed, by user.
func (s *Store) HoldEnds(ctx context.Context, saleID int64) (map[int64]time.Time, error) {
	out := map[int64]time.Time{}
	for _, k := range s.kindKeys(saleID, lua.KindHolds) {
		zs, err := s.rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstock.HoldEnds: %w", err)
		}
		for _, z := range zs {
			m, _ := z.Member.(string)
			u, err := strconv.ParseInt(m, 10, 64)
			if err != nil {
				continue
			}
			out[u] = time.UnixMilli(int64(z.Score))
		}
	}
	return out, nil
}
