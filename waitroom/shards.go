package waitroom

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// A sale whose stock is split over shards (flashsale.Sale.Shards > 1)
// keeps each user's buyer record on the user's home shard (lua.HomeShard)
// and counts reservations on every shard (lua.KindReserved), each shard
// under a hash tag of its own. The queue's scripts run on the sale's tag,
// which is shard 0's: on a Redis Cluster they cannot read the other
// shards' keys. So what they need of shards 1..S-1 is read here, before
// the script, with plain commands (one pipeline, which a cluster client
// splits by slot), and passed in ARGV. A sale with one shard reads
// nothing here: its scripts read shard 0's keys as they always did.

// shardKey is the key of a kind on one shard of the sale.
func shardKey(sale *flashsale.Sale, shard int, kind string) string {
	return lua.ShardKey(lua.ShardTag(sale.ID, shard, sale.Shards()), kind)
}

// otherReserved sums the reservation counters of shards 1..S-1 of the
// sale (0 for a sale with one shard). The script adds shard 0's counter,
// read atomically with the rest of the queue.
//
// Reading them apart from the script is safe because every counter only
// grows (units coming back to stock do not lower it, and a counter a loss
// reset only lowers the sum): a sum read a little before the script is at
// most the true one, so the purchases it misses look like unused places
// and make the cap a little stricter, for one tick, until the next read
// sees them. A bucket's snapshot ("r<bucket>") taken with it is the sum
// at the moment of the read, as if the bucket began that much earlier;
// the cap already counts every reservation made since the bucket began,
// whoever made it, so this changes nothing it relies on.
func otherReserved(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale) (int64, error) {
	n := sale.Shards()
	if n <= 1 {
		return 0, nil
	}
	cmds := make([]*redis.StringCmd, 0, n-1)
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := 1; sh < n; sh++ {
			cmds = append(cmds, p.Get(ctx, shardKey(sale, sh, lua.KindReserved)))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return 0, fmt.Errorf("read the reservation counters: %w", err)
	}
	var sum int64
	for _, c := range cmds {
		if c.Err() == redis.Nil {
			continue // no reservation on this shard yet
		}
		v, err := c.Int64()
		if err != nil {
			return 0, fmt.Errorf("read the reservation counters: %w", err)
		}
		sum += v
	}
	return sum, nil
}

// buyers reports, for each of users, whether it holds a buyer record in
// the sale (a reservation, or a claim of one in flight) on its home
// shard. A sale with one shard asks one HMGET of shard 0; otherwise the
// users are grouped by home shard, one HMGET per shard in one pipeline.
// With skipHome0, users whose home is shard 0 are not asked (false): for a
// script that reads shard 0 itself.
func buyers(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, users []int64, skipHome0 bool) ([]bool, error) {
	out := make([]bool, len(users))
	if len(users) == 0 {
		return out, nil
	}
	n := sale.Shards()
	if n <= 1 {
		if skipHome0 {
			return out, nil
		}
		ids := make([]string, len(users))
		for i, u := range users {
			ids[i] = strconv.FormatInt(u, 10)
		}
		recs, err := rdb.HMGet(ctx, lua.BuyersKey(sale.ID), ids...).Result()
		if err != nil {
			return nil, fmt.Errorf("read the buyers: %w", err)
		}
		for i := range out {
			out[i] = i < len(recs) && recs[i] != nil
		}
		return out, nil
	}
	idx := make([][]int, n) // shard → indexes into users
	ids := make([][]string, n)
	for i, u := range users {
		h := lua.HomeShard(u, n)
		if h == 0 && skipHome0 {
			continue
		}
		idx[h] = append(idx[h], i)
		ids[h] = append(ids[h], strconv.FormatInt(u, 10))
	}
	cmds := make([]*redis.SliceCmd, n)
	asked := false
	for sh := range n {
		asked = asked || len(ids[sh]) > 0
	}
	if !asked {
		return out, nil
	}
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range n {
			if len(ids[sh]) > 0 {
				cmds[sh] = p.HMGet(ctx, shardKey(sale, sh, lua.KindBuyers), ids[sh]...)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the buyers: %w", err)
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

// boughtElsewhere returns those of users whose buyer record lies on a
// shard other than 0 (none for a sale with one shard), for a script that
// checks shard 0's buyers itself.
func boughtElsewhere(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, users []int64) ([]int64, error) {
	if sale.Shards() <= 1 {
		return nil, nil
	}
	b, err := buyers(ctx, rdb, sale, users, true)
	if err != nil {
		return nil, err
	}
	var out []int64
	for i, u := range users {
		if b[i] {
			out = append(out, u)
		}
	}
	return out, nil
}

// tickShardArgs is the tail of tickScript's ARGV for a sale with more than
// one shard (nil for one shard): the reservations of shards 1..S-1 (see
// otherReserved), then the users among those whose presence lapsed (as
// the script will find them: the same range and limit) who bought on a
// shard other than 0, so that the script does not count them gone: the
// reservation counter counts them.
//
// The buyers are read before the script, not with it. A lapsed shopper
// who buys in between, or lapses in between, is counted gone although the
// counter counts its purchase too, which frees one place more than is
// free until its admission leaves the cap's window; a shopper counted
// gone who buys later does the same today on one shard. A place freed
// that way admits one more shopper, never a second purchase: the stock
// script is what decides purchases, each user's on its home shard.
func tickShardArgs(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, a tickArgs) ([]any, error) {
	if sale.Shards() <= 1 {
		return nil, nil
	}
	others, err := otherReserved(ctx, rdb, sale)
	if err != nil {
		return nil, err
	}
	out := []any{others}
	if a.graceMs <= 0 {
		return out, nil
	}
	lapsed, err := rdb.ZRangeByScore(ctx, lua.QueueKey(sale.ID, keyPresence), &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(a.nowMs-a.graceMs, 10), Count: 1000,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("read the lapsed shoppers: %w", err)
	}
	users := make([]int64, 0, len(lapsed))
	for _, s := range lapsed {
		if u, err := strconv.ParseInt(s, 10, 64); err == nil {
			users = append(users, u)
		}
	}
	bought, err := boughtElsewhere(ctx, rdb, sale, users)
	if err != nil {
		return nil, err
	}
	for _, u := range bought {
		out = append(out, u)
	}
	return out, nil
}

// restoreShardArgs fills in what restoreScript needs of the other shards
// of a sale with more than one shard: their reservations (otherReserved,
// for the buckets' snapshots, which must count as the tick does) and the
// connections' users who bought on a shard other than 0 (an admitted
// buyer does not count against the cap again). The same window as in
// tickShardArgs applies, and is as harmless.
func restoreShardArgs(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale, in *restoreInput) error {
	if sale == nil || sale.Shards() <= 1 {
		return nil
	}
	others, err := otherReserved(ctx, rdb, sale)
	if err != nil {
		return err
	}
	users := make([]int64, len(in.conns))
	for i, c := range in.conns {
		users[i] = c.user
	}
	bought, err := boughtElsewhere(ctx, rdb, sale, users)
	if err != nil {
		return err
	}
	in.otherReserved, in.boughtElsewhere = others, bought
	return nil
}
