package waitroom

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/lua"
)

// A sale whose stock is split over shards (flashsale.Sale.Shards > 1)
// keeps each user's buyer record on the user's home shard and counts
// reservations on every shard, each shard under a hash tag of its own.
// The queue's scripts run on the sale's tag, which is shard 0's: on a
// Redis Cluster they cannot read the other shards' keys. So what they
// need of shards 1..S-1 is asked of the stock (Room.reservations, the
// redisstock adapter, which names the keys and reads each shard's in one
// pipeline split by slot) before the script, and passed in ARGV. A sale
// with one shard reads nothing here: its scripts read shard 0's counter
// and buyers as they always did.
//
// The other shards' reservations (redisstock's OtherReserved) are read
// apart from the script. That is safe for the capacity cap because the
// sum read is at most the true one: the purchases it misses look like
// unused places and make the cap a little stricter, for one tick, until
// the next read sees them. A bucket's snapshot ("r<bucket>") taken with
// it is the sum at the moment of the read, as if the bucket began that
// much earlier; the cap already counts every reservation made since the
// bucket began, whoever made it, so this changes nothing it relies on.

// tickShardArgs is the tail of tickScript's ARGV for a sale with more than
// one shard (nil for one shard): the reservations of shards 1..S-1, then
// the users among those whose presence lapsed (as the script will find
// them: the same range and limit) who bought on a shard other than 0, so
// that the script does not count them gone: the reservation counter
// counts them.
//
// The buyers are read before the script, not with it. A lapsed shopper
// who buys in between, or lapses in between, is counted gone although the
// counter counts its purchase too, which frees one place more than is
// free until its admission leaves the cap's window; a shopper counted
// gone who buys later does the same today on one shard. A place freed
// that way admits one more shopper, never a second purchase: the stock
// script is what decides purchases, each user's on its home shard.
func tickShardArgs(ctx context.Context, rdb redis.UniversalClient, st *redisstock.Store, sale *flashsale.Sale, a tickArgs) ([]any, error) {
	if sale.Shards() <= 1 {
		return nil, nil
	}
	others, err := st.OtherReserved(ctx, sale)
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
	bought, err := st.BoughtElsewhere(ctx, sale, users)
	if err != nil {
		return nil, err
	}
	for _, u := range bought {
		out = append(out, u)
	}
	return out, nil
}

// restoreShardArgs fills in what restoreScript needs of the other shards
// of a sale with more than one shard: their reservations (for the
// buckets' snapshots, which must count as the tick does) and the
// connections' users who bought on a shard other than 0 (an admitted
// buyer does not count against the cap again). The same window as in
// tickShardArgs applies, and is as harmless.
func restoreShardArgs(ctx context.Context, st *redisstock.Store, sale *flashsale.Sale, in *restoreInput) error {
	if sale == nil || sale.Shards() <= 1 {
		return nil
	}
	others, err := st.OtherReserved(ctx, sale)
	if err != nil {
		return err
	}
	users := make([]int64, len(in.conns))
	for i, c := range in.conns {
		users[i] = c.user
	}
	bought, err := st.BoughtElsewhere(ctx, sale, users)
	if err != nil {
		return err
	}
	in.otherReserved, in.boughtElsewhere = others, bought
	return nil
}
