package redisstock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/lua"
)

// HoldReq is one hold of HoldMany.
type HoldReq struct {
	ItemID, UserID int64
	OrderID        string
}

// HoldMany takes the holds of reqs, all until until, and returns one
// answer per request, as Hold's (nil, SOLD_OUT, ALREADY_PURCHASED with the
// order's id, ...). On one stock shard the scripts go in one pipeline, in
// order (the first wave of a large sale is thousands of holds: one round
// trip instead of one each); a sharded sale's holds, which may borrow
// across shards, go one by one. err is a failure of the whole call (the
// answers are then not to be read: some holds may have been taken).
func (s *Store) HoldMany(ctx context.Context, saleID int64, reqs []HoldReq, until time.Time) ([]error, error) {
	out := make([]error, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	if s.layout(saleID) != nil {
		for i, r := range reqs {
			out[i] = s.Hold(ctx, saleID, r.ItemID, r.UserID, r.OrderID, until)
		}
		return out, nil
	}
	keys := append(reserveKeys(saleID), lua.HoldsKey(saleID))
	run := func(load bool, idx []int) ([]*redis.Cmd, *redis.Cmd, error) {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(idx))
		for j, i := range idx {
			r := reqs[i]
			if load {
				cmds[j] = s.reserve.Eval(ctx, pipe, keys, r.ItemID, r.UserID, r.OrderID, until.UnixMilli())
			} else {
				cmds[j] = s.reserve.EvalSha(ctx, pipe, keys, r.ItemID, r.UserID, r.OrderID, until.UnixMilli())
			}
		}
		// One WAIT covers every script before it on this connection.
		wait := s.waitCmd(ctx, pipe)
		_, err := pipe.Exec(ctx)
		if err != nil && ctx.Err() != nil {
			return nil, nil, fmt.Errorf("redisstock.HoldMany: %w", err)
		}
		return cmds, wait, nil
	}
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	for load := false; len(idx) > 0; load = true {
		cmds, wait, err := run(load, idx)
		if err != nil {
			return out, err
		}
		var again []int
		for j, i := range idx {
			res, err := cmds[j].Slice()
			if err != nil && !load && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				again = append(again, i) // did not run: once more with the script
				continue
			}
			if err != nil {
				out[i] = fmt.Errorf("redisstock.HoldMany: %w", err)
				continue
			}
			out[i] = s.replicated(reserveResult(res), wait)
		}
		idx = again
	}
	return out, nil
}
