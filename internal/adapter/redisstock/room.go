package redisstock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// What the waiting room asks of the stock: the reservation counters that
// its capacity cap counts and the buyer records that tell a shopper who
// bought from one who did not. The room's scripts run on the sale's tag
// and read shard 0's counter and buyers themselves, atomically with the
// queue (RoomKeys, through RoomLua); on a Redis Cluster they cannot
// read the other shards' keys, each under a tag and slot of its own. So
// the room asks for shards 1..S-1 here, before its script, and passes the
// answers in. Each read is one pipeline of plain commands, one key each,
// which a cluster client splits by slot: no command spans two shards.
//
// These methods take the sale rather than its id so that a Store never
// told of the sale (SetShards) still reads every shard: the sale says
// how many it has.

// RoomKeys are the keys of the sale's shard 0 that a waiting-room script
// of the sale reads atomically with its queue (they share its slot): the
// reservation counter and the buyer records. The script reads them only
// through RoomLua, so what they hold and how stays this package's.
func RoomKeys(saleID int64) (reserved, buyers string) {
	return lua.ReservedKey(saleID), lua.BuyersKey(saleID)
}

// RoomLua is the Lua prelude through which a room script reads RoomKeys:
// stock_reserved(key) is the shard's count of reservations ever made (it
// only grows), stock_bought(key, uid) whether uid holds a buyer record on
// the shard (a reservation, or a claim of one in flight).
const RoomLua = `
local function stock_reserved(k) return tonumber(redis.call('GET', k) or '0') end
local function stock_bought(k, uid) return redis.call('HEXISTS', k, uid) == 1 end
`

// saleLayout is the sale's shard layout (nil for a sale with one shard),
// learned from the sale itself.
func (s *Store) saleLayout(sale *flashsale.Sale) *layout {
	s.SetShards(sale.ID, sale.Shards())
	return s.layout(sale.ID)
}

// OtherReserved sums the reservation counters of shards 1..S-1 of the
// sale (0 for a sale with one shard); shard 0's is the caller's to read,
// atomically with whatever it counts against.
//
// A sum read before the caller's script is safe to use in it because
// every counter only grows (units coming back to stock do not lower it,
// and a counter a Redis loss reset only lowers the sum): the sum read is
// at most the true one when the script runs, never more. It misses the
// reservations made in between, which the next read sees.
func (s *Store) OtherReserved(ctx context.Context, sale *flashsale.Sale) (int64, error) {
	l := s.saleLayout(sale)
	if l == nil {
		return 0, nil
	}
	cmds := make([]*redis.StringCmd, 0, l.shards-1)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := 1; sh < l.shards; sh++ {
			cmds = append(cmds, p.Get(ctx, l.key(sh, lua.KindReserved)))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("redisstock.OtherReserved: %w", err)
	}
	var sum int64
	for _, c := range cmds {
		if errors.Is(c.Err(), redis.Nil) {
			continue // no reservation on this shard yet
		}
		v, err := c.Int64()
		if err != nil {
			return 0, fmt.Errorf("redisstock.OtherReserved: %w", err)
		}
		sum += v
	}
	return sum, nil
}

// BuyerRecords reports, for each of users, whether it holds a buyer
// record in the sale on its home shard: a reservation, or a claim of one
// in flight.
func (s *Store) BuyerRecords(ctx context.Context, sale *flashsale.Sale, users []int64) ([]bool, error) {
	out, err := s.buyerRecords(ctx, sale, users, false)
	if err != nil {
		return nil, fmt.Errorf("redisstock.BuyerRecords: %w", err)
	}
	return out, nil
}

// BoughtElsewhere returns those of users whose buyer record lies on a
// shard other than 0 (none for a sale with one shard), for a script that
// reads shard 0's buyers itself.
func (s *Store) BoughtElsewhere(ctx context.Context, sale *flashsale.Sale, users []int64) ([]int64, error) {
	if sale.Shards() <= 1 {
		return nil, nil
	}
	b, err := s.buyerRecords(ctx, sale, users, true)
	if err != nil {
		return nil, fmt.Errorf("redisstock.BoughtElsewhere: %w", err)
	}
	var out []int64
	for i, u := range users {
		if b[i] {
			out = append(out, u)
		}
	}
	return out, nil
}

// buyerRecords is BuyerRecords; with skipHome0, users whose home is shard
// 0 are not asked (false). A sale with one shard asks one HMGET of its
// buyers; otherwise the users are grouped by home shard, one HMGET per
// shard in one pipeline.
func (s *Store) buyerRecords(ctx context.Context, sale *flashsale.Sale, users []int64, skipHome0 bool) ([]bool, error) {
	out := make([]bool, len(users))
	if len(users) == 0 {
		return out, nil
	}
	l := s.saleLayout(sale)
	if l == nil {
		if skipHome0 {
			return out, nil
		}
		ids := make([]string, len(users))
		for i, u := range users {
			ids[i] = strconv.FormatInt(u, 10)
		}
		recs, err := s.rdb.HMGet(ctx, lua.BuyersKey(sale.ID), ids...).Result()
		if err != nil {
			return nil, err
		}
		for i := range out {
			out[i] = i < len(recs) && recs[i] != nil
		}
		return out, nil
	}
	idx := make([][]int, l.shards) // shard → indexes into users
	ids := make([][]string, l.shards)
	asked := false
	for i, u := range users {
		h := lua.HomeShard(u, l.shards)
		if h == 0 && skipHome0 {
			continue
		}
		idx[h] = append(idx[h], i)
		ids[h] = append(ids[h], strconv.FormatInt(u, 10))
		asked = true
	}
	if !asked {
		return out, nil
	}
	cmds := make([]*redis.SliceCmd, l.shards)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range l.shards {
			if len(ids[sh]) > 0 {
				cmds[sh] = p.HMGet(ctx, l.key(sh, lua.KindBuyers), ids[sh]...)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for sh, c := range cmds {
		if c == nil {
			continue
		}
		recs := c.Val()
		for j, i := range idx[sh] {
			out[i] = j < len(recs) && recs[j] != nil
		}
	}
	return out, nil
}
