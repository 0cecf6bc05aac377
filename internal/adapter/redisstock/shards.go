package redisstock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// layout is the key layout of a sale whose stock is split over shards.
type layout struct {
	shards int
	tags   []string // shard → hash tag (lua.ShardTag)
}

func (l *layout) key(shard int, kind string) string { return lua.ShardKey(l.tags[shard], kind) }

// shardScripts are the scripts of sharded sales (lua.Shard*), made at the
// first use: a Store whose sales all have one shard never needs them.
type shardScripts struct {
	reserve, take, settle, abandon, release, give *redis.Script
}

func (s *Store) scripts() *shardScripts {
	s.shardOnce.Do(func() {
		s.sh = &shardScripts{
			reserve: redis.NewScript(lua.ShardReserve), take: redis.NewScript(lua.ShardTake),
			settle: redis.NewScript(lua.ShardSettle), abandon: redis.NewScript(lua.ShardAbandon),
			release: redis.NewScript(lua.ShardRelease), give: redis.NewScript(lua.ShardGive),
		}
	})
	return s.sh
}

// SetShards tells the Store over how many shards the sale's stock is split
// (flashsale.Sale.Shards); a sale it was never told of has one. The count
// of a sale never changes. The sale store calls it for every sale it reads
// or creates, so every process whose sale store shares this Store knows
// the count of every sale it serves.
func (s *Store) SetShards(saleID int64, shards int) {
	if shards <= 1 {
		return
	}
	if l, ok := s.layouts.Load(saleID); ok && l.(*layout).shards == shards {
		return
	}
	l := &layout{shards: shards, tags: make([]string, shards)}
	for i := range shards {
		l.tags[i] = lua.ShardTag(saleID, i, shards)
	}
	s.layouts.Store(saleID, l)
}

// Shards is the number of shards of the sale's stock (1 unless SetShards
// said otherwise).
func (s *Store) Shards(saleID int64) int {
	if l := s.layout(saleID); l != nil {
		return l.shards
	}
	return 1
}

// HomeShard is the shard that holds userID's records in the sale.
func (s *Store) HomeShard(saleID, userID int64) int {
	return lua.HomeShard(userID, s.Shards(saleID))
}

// ShardRemaining returns itemID → remaining units of one shard of a sale.
func (s *Store) ShardRemaining(ctx context.Context, saleID int64, shard int) (map[int64]int64, error) {
	key := lua.StockKey(saleID)
	if l := s.layout(saleID); l != nil && shard > 0 && shard < l.shards {
		key = l.key(shard, lua.KindStock)
	}
	m, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstock.ShardRemaining: %w", err)
	}
	out := make(map[int64]int64, len(m))
	for k, v := range m {
		id, err1 := strconv.ParseInt(k, 10, 64)
		n, err2 := strconv.ParseInt(v, 10, 64)
		if err1 == nil && err2 == nil {
			out[id] = n
		}
	}
	return out, nil
}

// tags are the hash tags of the sale's stock shards (its own tag alone for
// a sale with one shard).
func (s *Store) tags(saleID int64) []string {
	if l := s.layout(saleID); l != nil {
		return l.tags
	}
	return []string{lua.Tag(saleID)}
}

// kindKeys is the key of one kind on every shard of the sale.
func (s *Store) kindKeys(saleID int64, kind string) []string {
	tags := s.tags(saleID)
	keys := make([]string, len(tags))
	for i, t := range tags {
		keys[i] = lua.ShardKey(t, kind)
	}
	return keys
}

// layout is nil for a sale with one shard.
func (s *Store) layout(saleID int64) *layout {
	if v, ok := s.layouts.Load(saleID); ok {
		return v.(*layout)
	}
	return nil
}

// split divides n units over shards: every shard n/shards, the first n mod
// shards shards one more.
func split(n int64, shards, shard int) int64 {
	q := n / int64(shards)
	if int64(shard) < n%int64(shards) {
		q++
	}
	return q
}

func (s *Store) loadSharded(ctx context.Context, l *layout, remaining map[int64]int64) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range l.shards {
			vals := make([]any, 0, 2*len(remaining))
			for id, n := range remaining {
				vals = append(vals, strconv.FormatInt(id, 10), split(n, l.shards, sh))
			}
			p.HSet(ctx, l.key(sh, lua.KindStock), vals...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstock.Load: %w", err)
	}
	return nil
}

// restoreSharded is Restore over shards: each item's remaining units split
// as Load splits them, each buyer record on its user's home shard (a
// restored reservation holds a unit of its home shard).
func (s *Store) restoreSharded(ctx context.Context, l *layout, remaining map[int64]int64, buyers map[int64]Buyer) (int, error) {
	var stockCmds []*redis.BoolCmd
	buyerCmds := make([][]*redis.BoolCmd, l.shards)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for id, n := range remaining {
			for sh := range l.shards {
				stockCmds = append(stockCmds, p.HSetNX(ctx, l.key(sh, lua.KindStock), strconv.FormatInt(id, 10), split(n, l.shards, sh)))
			}
		}
		for user, b := range buyers {
			h := lua.HomeShard(user, l.shards)
			buyerCmds[h] = append(buyerCmds[h], p.HSetNX(ctx, l.key(h, lua.KindBuyers), strconv.FormatInt(user, 10), lua.BuyerValue(b.OrderID, b.ItemID, b.CreatedAt.UnixMilli())))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("redisstock.Restore: %w", err)
	}
	items := map[int64]bool{}
	for i, c := range stockCmds {
		if c.Val() {
			items[int64(i/l.shards)] = true
		}
	}
	var errs []error
	for h, cmds := range buyerCmds {
		var written int64
		for _, c := range cmds {
			if c.Val() {
				written++
			}
		}
		if written > 0 {
			if err := s.rdb.IncrBy(ctx, l.key(h, lua.KindReserved), written).Err(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return len(items), fmt.Errorf("redisstock.Restore: reservation counter: %w", err)
	}
	return len(items), nil
}

var errClaimBusy = &flashsale.Error{Code: flashsale.CodeUnavailable, Message: "your purchase in this sale is still in progress; try again shortly"}

// reserveSharded is Reserve (Hold, when hold) for a sharded sale: the home
// shard's script, then, when the home shard is dry, a loan from the other
// shards in turn.
func (s *Store) reserveSharded(ctx context.Context, l *layout, itemID, userID int64, orderID string, nowMs int64, hold bool) error {
	sc := s.scripts()
	home := lua.HomeShard(userID, l.shards)
	keys := []string{l.key(home, lua.KindStock), l.key(home, lua.KindBuyers), l.key(home, lua.KindPending),
		l.key(home, lua.KindReserved), l.key(home, lua.KindClaims)}
	if hold {
		keys = append(keys, l.key(home, lua.KindHolds))
	}
	taken, r := s.pipelined(ctx, sc.reserve, keys, itemID, userID, orderID, nowMs)
	if !taken {
		r = s.runScript(ctx, sc.reserve, keys, itemID, userID, orderID, nowMs)
	}
	res, err := r.res, r.err
	if err != nil {
		return fmt.Errorf("redisstock.Reserve: %w", err)
	}
	if len(res) == 2 {
		switch code, _ := res[0].(int64); code {
		case lua.ResultBusy:
			return errClaimBusy
		case lua.ResultClaimed:
			return s.borrow(ctx, l, home, itemID, userID, orderID, nowMs, hold)
		}
	}
	// RequireReplicas covers the home shard's reservation; a borrowed
	// unit's scripts run without WAIT (sharding is for a Redis Cluster,
	// where RequireReplicas is not used).
	return s.replicated(reserveResult(res), r.wait)
}

// borrow finds a unit for the claim of orderID on the shards after home, in
// turn. An error leaves the claim as it is: a script may have run, and the
// claim sweep (Sweep) or a Release of the order settles it.
func (s *Store) borrow(ctx context.Context, l *layout, home int, itemID, userID int64, orderID string, nowMs int64, hold bool) error {
	sc := s.scripts()
	settleKeys := []string{l.key(home, lua.KindBuyers), l.key(home, lua.KindPending),
		l.key(home, lua.KindReserved), l.key(home, lua.KindClaims)}
	if hold {
		settleKeys = append(settleKeys, l.key(home, lua.KindHolds))
	}
	noRecord := false
	for i := 1; i < l.shards; i++ {
		d := (home + i) % l.shards
		n, err := sc.take.Run(ctx, s.rdb, []string{l.key(d, lua.KindStock), l.key(d, lua.KindLoans)}, itemID, orderID, userID, nowMs).Int64()
		if err != nil {
			return fmt.Errorf("redisstock.Reserve: shard %d: %w", d, err)
		}
		switch n {
		case lua.ResultSoldOut:
			continue
		case lua.ResultNoItem:
			noRecord = true
			continue
		}
		gone, err := sc.settle.Run(ctx, s.rdb, settleKeys, userID, orderID, itemID, nowMs, d).Int64()
		if err != nil {
			return fmt.Errorf("redisstock.Reserve: settle: %w", err)
		}
		if gone == 0 {
			return nil
		}
		// The claim was abandoned meanwhile (swept or dropped): it can
		// never hold the unit, which goes back.
		if _, err := s.giveLoan(ctx, l, d, orderID, itemID); err != nil {
			return fmt.Errorf("redisstock.Reserve: %w", err)
		}
		return fmt.Errorf("redisstock.Reserve: %w", errClaimBusy)
	}
	held, err := sc.abandon.Run(ctx, s.rdb, []string{l.key(home, lua.KindBuyers), l.key(home, lua.KindClaims)}, userID, orderID, itemID).Int64()
	if err != nil {
		return fmt.Errorf("redisstock.Reserve: abandon: %w", err)
	}
	switch {
	case held == 0:
		return nil // settled by this very call: cannot happen, but it holds a unit
	case noRecord:
		return errNoItem
	}
	return errSoldOut
}

// giveLoan gives the unit lent by shard d to orderID back, once.
func (s *Store) giveLoan(ctx context.Context, l *layout, d int, orderID string, itemID int64) (bool, error) {
	n, err := s.scripts().give.Run(ctx, s.rdb, []string{l.key(d, lua.KindStock), l.key(d, lua.KindLoans)}, orderID, itemID).Int64()
	if err != nil {
		return false, fmt.Errorf("give back to shard %d: %w", d, err)
	}
	return n == 1, nil
}

// releaseSharded is Release for a sharded sale.
func (s *Store) releaseSharded(ctx context.Context, l *layout, userID, itemID int64, orderID string) (bool, error) {
	home := lua.HomeShard(userID, l.shards)
	res, err := s.scripts().release.Run(ctx, s.rdb, []string{l.key(home, lua.KindStock), l.key(home, lua.KindBuyers),
		l.key(home, lua.KindPending), l.key(home, lua.KindReturning)}, userID, orderID, itemID).Slice()
	if err != nil {
		return false, fmt.Errorf("redisstock.Release: %w", err)
	}
	if len(res) != 2 {
		return false, fmt.Errorf("redisstock.Release: %w: %v", errBadReply, res)
	}
	code, _ := res[0].(int64)
	switch code {
	case lua.ResultReleased:
		return true, nil
	case lua.ResultOwed:
	default:
		return false, nil // given back before, or a claim the sweep settles
	}
	ds, _ := res[1].(string)
	d, err := strconv.Atoi(ds)
	if err != nil || d < 0 || d >= l.shards {
		return false, fmt.Errorf("redisstock.Release: %w: donor %q", errBadReply, ds)
	}
	ok, err := s.finishReturn(ctx, l, home, d, orderID, itemID)
	if err != nil {
		return ok, fmt.Errorf("redisstock.Release: %w", err)
	}
	return ok, nil
}

// finishReturn gives an owed unit back to its donor, then forgets the debt
// on the home shard; run again after a failure, it gives nothing twice.
func (s *Store) finishReturn(ctx context.Context, l *layout, home, d int, orderID string, itemID int64) (bool, error) {
	ok, err := s.giveLoan(ctx, l, d, orderID, itemID)
	if err != nil {
		return false, err
	}
	if err := s.rdb.HDel(ctx, l.key(home, lua.KindReturning), orderID).Err(); err != nil {
		return ok, fmt.Errorf("forget the return: %w", err)
	}
	return ok, nil
}

// Sweep settles what reservations of a sharded sale left behind when they
// were cut short (a process stopped, Redis answered late): claims recorded
// before the given time are abandoned and any unit lent to them goes back;
// units a release owes to their donor go back. It reports how many units
// went back. A sale with one shard has nothing to sweep.
func (s *Store) Sweep(ctx context.Context, saleID int64, before time.Time) (int, error) {
	l := s.layout(saleID)
	if l == nil {
		return 0, nil
	}
	sc := s.scripts()
	back := 0
	var errs []error
	for h := range l.shards {
		claims, err := s.rdb.ZRangeByScore(ctx, l.key(h, lua.KindClaims), &redis.ZRangeBy{
			Min: "-inf", Max: "(" + strconv.FormatInt(before.UnixMilli(), 10), Count: 1000,
		}).Result()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, m := range claims {
			parts := strings.Split(m, "|")
			if len(parts) != 3 {
				continue
			}
			user, err1 := strconv.ParseInt(parts[1], 10, 64)
			item, err2 := strconv.ParseInt(parts[2], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			gone, err := sc.abandon.Run(ctx, s.rdb, []string{l.key(h, lua.KindBuyers), l.key(h, lua.KindClaims)}, user, parts[0], item).Int64()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if gone == 0 {
				continue
			}
			for i := 1; i < l.shards; i++ {
				ok, err := s.giveLoan(ctx, l, (h+i)%l.shards, parts[0], item)
				if err != nil {
					errs = append(errs, err)
				}
				if ok {
					back++
				}
			}
		}
		owed, err := s.rdb.HGetAll(ctx, l.key(h, lua.KindReturning)).Result()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for order, v := range owed {
			ds, is, _ := strings.Cut(v, "|")
			d, err1 := strconv.Atoi(ds)
			item, err2 := strconv.ParseInt(is, 10, 64)
			if err1 != nil || err2 != nil || d < 0 || d >= l.shards {
				continue
			}
			ok, err := s.finishReturn(ctx, l, h, d, order, item)
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				back++
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return back, fmt.Errorf("redisstock.Sweep: %w", err)
	}
	return back, nil
}

// remainingSharded sums each item's units over the shards.
func (s *Store) remainingSharded(ctx context.Context, l *layout) (map[int64]int64, error) {
	cmds := make([]*redis.MapStringStringCmd, l.shards)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range l.shards {
			cmds[sh] = p.HGetAll(ctx, l.key(sh, lua.KindStock))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstock.Remaining: %w", err)
	}
	out := map[int64]int64{}
	for _, c := range cmds {
		for k, v := range c.Val() {
			id, err1 := strconv.ParseInt(k, 10, 64)
			n, err2 := strconv.ParseInt(v, 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			out[id] += n
		}
	}
	return out, nil
}

// itemsRemainingSharded sums the items' units over the shards; an item
// missing on any shard reads as -1 (the sale's stock is to be rebuilt).
func (s *Store) itemsRemainingSharded(ctx context.Context, l *layout, fields []string) ([]int64, error) {
	cmds := make([]*redis.SliceCmd, l.shards)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range l.shards {
			cmds[sh] = p.HMGet(ctx, l.key(sh, lua.KindStock), fields...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstock.ItemsRemaining: %w", err)
	}
	out := make([]int64, len(fields))
	for _, c := range cmds {
		for i, v := range c.Val() {
			n := int64(-1)
			if str, ok := v.(string); ok {
				if m, err := strconv.ParseInt(str, 10, 64); err == nil {
					n = m
				}
			}
			if n < 0 || out[i] < 0 {
				out[i] = -1
				continue
			}
			out[i] += n
		}
	}
	return out, nil
}

// pendingBeforeSharded is PendingBefore over every shard, oldest first.
func (s *Store) pendingBeforeSharded(ctx context.Context, l *layout, saleID int64, t time.Time, limit int64) ([]Pending, error) {
	var out []Pending
	for sh := range l.shards {
		ps, err := s.PendingBeforeFrom(ctx, saleID, sh, t, 0, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
	}
	slices.SortStableFunc(out, func(a, b Pending) int { return cmp.Compare(a.ReservedAt.UnixMilli(), b.ReservedAt.UnixMilli()) })
	if limit > 0 && int64(len(out)) > limit {
		out = out[:limit]
	}
	return out, nil
}

// shardKey is the key of a kind on the shard that holds userID's records
// (the sale's own key for a sale with one shard).
func (s *Store) shardKey(saleID, userID int64, kind string) string {
	if l := s.layout(saleID); l != nil {
		return l.key(lua.HomeShard(userID, l.shards), kind)
	}
	return lua.ShardKey(lua.Tag(saleID), kind)
}

// dropSharded is Drop for a sharded sale: one DEL per shard, as keys of
// different slots never share a command.
func (s *Store) dropSharded(ctx context.Context, l *layout) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh := range l.shards {
			p.Del(ctx, l.key(sh, lua.KindStock), l.key(sh, lua.KindBuyers), l.key(sh, lua.KindLoans),
				l.key(sh, lua.KindClaims), l.key(sh, lua.KindReturning), l.key(sh, lua.KindHolds))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstock.Drop: %w", err)
	}
	return nil
}
