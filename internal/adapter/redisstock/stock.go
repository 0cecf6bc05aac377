// Package redisstock is the Redis adapter for a sale's stock: the only Go code
// that runs the reservation scripts of lua/. Script return codes become
// domain errors here and nowhere else.
//
// # Stock shards
//
// A sale with one shard (the default) keeps every key under its hash tag
// and runs one reserve and one release script per call. A sale created
// with StockShards S > 1 splits each item's units over S shards, each
// under a tag of its own in its own cluster slot (lua.ShardTag), so that
// one hot sale's reservations spread over a cluster's masters. A Store
// learns a sale's S from SetShards (the sale store calls it for every
// sale it reads); a sale it was never told of has one shard.
//
// Each user has a home shard (lua.HomeShard) that holds the user's buyer
// record, pending member, Kafka position and the shard's reservation
// counter: the record that allows one purchase per user per sale is
// decided by one script, atomically with the unit taken on the home
// shard. While the home shard has a unit, a reservation is that one
// script, one round trip (pipelined with the others, RunPipeline).
//
// When the home shard is dry, the same script records a claim instead
// (the buyer record marked c, and a member of the shard's claims set),
// so the user's other purchases answer UNAVAILABLE while it runs. The
// other shards are then asked in turn, from the one after home, to lend
// a unit (lua.ShardTake: decrement and a loan record naming the order);
// the first that has one is named in the settled buyer record
// (lua.ShardSettle), and the claim becomes an ordinary reservation. If
// every shard answers dry, the claim is abandoned and the answer is
// SOLD_OUT. A release on the home shard gives a home unit back there; a
// borrowed one moves the buyer record to the returning hash and gives the
// unit back to its lender, where removing the loan is what puts the unit
// back, so no unit goes back twice.
//
// The rule that keeps units from being sold twice: a loan belongs to its
// order only while the home shard holds the order's settled record, and
// settle succeeds only on the order's own claim. Once a claim is
// abandoned (by the reserve itself, by Sweep, or by Drop) it can never be
// settled, so any loan to it may go back at once. Sweep, run by the
// reconciler, abandons claims older than its bound (a reservation cut
// short between its calls) and gives their loans back, and finishes
// returns a release left half done.
//
// The guarantee, without failures: every unit is sold before any buyer
// is refused SOLD_OUT, and nobody buys twice. A SOLD_OUT answer means
// every shard was seen empty during the call (each at its own moment), so
// a refusal can meet a unit only if one came back (expiry, cancel,
// rejection) after its shard was read, as with one shard; the local
// sold-out flag of purchase/ is set only on that answer and cleared when
// any shard has a unit again. With failures: a reservation cut short
// between its calls leaves its unit lent to a claim until Sweep runs
// (after FLASHSALE_RECONCILE_AFTER), a release cut short leaves the unit
// owed until the next Release of the order or Sweep: units are held back
// for a while, never sold twice. A reservation costs one call more per
// dry shard it asks, and S + 1 calls when the whole sale is sold out; the
// sold-out flag spares Redis those.
package redisstock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// Store runs the stock scripts against Redis.
type Store struct {
	rdb     redis.UniversalClient
	reserve *redis.Script
	release *redis.Script
	claim   *redis.Script            // lua.HoldClaim
	lapse   *redis.Script            // lua.HoldLapse
	unclaim *redis.Script            // lua.HoldUnclaim
	pipe    atomic.Pointer[pipeline] // set by RunPipeline

	layouts   sync.Map // saleID → *layout, sales with more than one shard (SetShards)
	shardOnce sync.Once
	sh        *shardScripts

	// replicas and replicaWait: a reservation counts only once this many
	// replicas hold it (WAIT), see RequireReplicas.
	replicas    int
	replicaWait time.Duration
}

// errUnreplicated: the reservation ran on the master but no replica
// acknowledged it in time. It may be lost at a failover, so no 202 may
// rest on it; the caller releases it (a no-op where it was lost) and
// answers 503.
var errUnreplicated = errors.New("redisstock.Reserve: the reservation reached no replica in time")

// RequireReplicas makes a reservation succeed only once n replicas
// acknowledged it (WAIT n, at most wait), for a master with replicas that
// a failover may promote (Sentinel): with asynchronous replication, the
// last writes of a master are lost when a replica that has not received
// them is promoted, and a unit sold there would be sold again. Call it
// before use.
func (s *Store) RequireReplicas(n int, wait time.Duration) {
	s.replicas, s.replicaWait = n, wait
}

// waitCmd queues the WAIT of RequireReplicas on pipe (nil when none is
// required).
func (s *Store) waitCmd(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	if s.replicas <= 0 {
		return nil
	}
	return pipe.Do(ctx, "WAIT", s.replicas, s.replicaWait.Milliseconds())
}

// replicated turns a reservation's result into errUnreplicated when WAIT
// did not see enough replicas.
func (s *Store) replicated(err error, wait *redis.Cmd) error {
	if err != nil || wait == nil {
		return err
	}
	if n, werr := wait.Int64(); werr != nil || n < int64(s.replicas) {
		return errUnreplicated
	}
	return nil
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, reserve: redis.NewScript(lua.Reserve), release: redis.NewScript(lua.Release),
		claim: redis.NewScript(lua.HoldClaim), lapse: redis.NewScript(lua.HoldLapse), unclaim: redis.NewScript(lua.HoldUnclaim)}
}

// LoadScripts loads the scripts into Redis (at start; go-redis also falls
// back from EVALSHA to EVAL when Redis answers NOSCRIPT after a restart).
//
// Every script a purchase runs is loaded, so that its first EVALSHA runs
// the script: one cut short by a frozen Redis is then settled by what it
// did (purchase's uncertain reservations), not lost to a NOSCRIPT answer
// nobody read.
func (s *Store) LoadScripts(ctx context.Context) error {
	for _, sc := range []*redis.Script{s.reserve, s.release, s.claim, s.unclaim, s.lapse} {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("redisstock.LoadScripts: %w", err)
		}
	}
	return nil
}

// Load sets the remaining stock of a sale's items (itemID → units). It is
// used when a sale is created and when stock is rebuilt from the database.
func (s *Store) Load(ctx context.Context, saleID int64, remaining map[int64]int64) error {
	if len(remaining) == 0 {
		return nil
	}
	if l := s.layout(saleID); l != nil {
		return s.loadSharded(ctx, l, remaining)
	}
	vals := make([]any, 0, 2*len(remaining))
	for id, n := range remaining {
		vals = append(vals, strconv.FormatInt(id, 10), n)
	}
	if err := s.rdb.HSet(ctx, lua.StockKey(saleID), vals...).Err(); err != nil {
		return fmt.Errorf("redisstock.Load: %w", err)
	}
	return nil
}

// Restore re-creates a sale's stock and buyer records after Redis lost its
// data, from what the database knows: remaining units per item and the buyer
// record of every live order (userID → Buyer). Every field is written only
// where it is missing (HSETNX, all in one MULTI), so two restorers racing,
// or a restore racing the sale's first Load, never overwrite a count that
// reservations have already moved. It reports how many stock fields it set.
//
// Each buyer record it writes also counts in the sale's reservation counter
// (lua.ReservedKey), as the reserve script would have counted it: the
// waiting room's capacity cap takes an admitted shopper who holds a buyer
// record as a used admission, and a restored admission whose reservation the
// lost counter no longer held would otherwise look unused for the whole
// admission lifetime and keep the queue from moving.
func (s *Store) Restore(ctx context.Context, saleID int64, remaining map[int64]int64, buyers map[int64]Buyer) (int, error) {
	if l := s.layout(saleID); l != nil {
		return s.restoreSharded(ctx, l, remaining, buyers)
	}
	var stockCmds, buyerCmds []*redis.BoolCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for id, n := range remaining {
			stockCmds = append(stockCmds, p.HSetNX(ctx, lua.StockKey(saleID), strconv.FormatInt(id, 10), n))
		}
		for user, b := range buyers {
			buyerCmds = append(buyerCmds, p.HSetNX(ctx, lua.BuyersKey(saleID), strconv.FormatInt(user, 10), lua.BuyerValue(b.OrderID, b.ItemID, b.CreatedAt.UnixMilli())))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("redisstock.Restore: %w", err)
	}
	set := 0
	for _, c := range stockCmds {
		if c.Val() {
			set++
		}
	}
	var written int64
	for _, c := range buyerCmds {
		if c.Val() {
			written++
		}
	}
	if written > 0 {
		if err := s.rdb.IncrBy(ctx, lua.ReservedKey(saleID), written).Err(); err != nil {
			return set, fmt.Errorf("redisstock.Restore: reservation counter: %w", err)
		}
	}
	return set, nil
}

// Reserve takes one unit of itemID for userID under orderID (in a shared
// pipeline while RunPipeline runs). It returns nil on success, or a domain
// error: ALREADY_PURCHASED (with the existing order's id), SOLD_OUT,
// NOT_FOUND (no stock record for the item).
func (s *Store) Reserve(ctx context.Context, saleID, itemID, userID int64, orderID string, now time.Time) error {
	return s.ReserveAs(ctx, 0, saleID, itemID, userID, orderID, now)
}

// ReserveAs is Reserve made under the placement lease slot (lease.go; 0:
// none), recorded beside the reservation so that the reservation is
// settled as soon as the lease lapses. A sale split over shards records
// no lease: its reservations are settled after the reconcile bound.
func (s *Store) ReserveAs(ctx context.Context, slot int, saleID, itemID, userID int64, orderID string, now time.Time) error {
	if l := s.layout(saleID); l != nil {
		return s.reserveSharded(ctx, l, itemID, userID, orderID, now.UnixMilli(), false)
	}
	var taken bool
	var r callReply
	if slot > 0 {
		keys := append(reserveKeys(saleID), lua.ShardKey(lua.Tag(saleID), lua.KindOwners))
		args := []any{itemID, userID, orderID, now.UnixMilli(), slot}
		if taken, r = s.pipelinedArgs(ctx, s.reserve, keys, args...); !taken {
			r = s.runScriptArgs(ctx, s.reserve, keys, args...)
		}
	} else {
		keys := reserveKeys(saleID)
		if taken, r = s.pipelined(ctx, s.reserve, keys, itemID, userID, orderID, now.UnixMilli()); !taken {
			r = s.runScript(ctx, s.reserve, keys, itemID, userID, orderID, now.UnixMilli())
		}
	}
	if r.err != nil {
		return fmt.Errorf("redisstock.Reserve: %w", r.err)
	}
	return s.replicated(reserveResult(r.res), r.wait)
}

// runScript runs one reservation script outside the pipeline, followed by
// the WAIT of RequireReplicas on the same connection (WAIT counts the
// replicas holding that connection's writes).
func (s *Store) runScript(ctx context.Context, script *redis.Script, keys []string, itemID, userID int64, orderID string, nowMs int64) callReply {
	return s.runScriptArgs(ctx, script, keys, itemID, userID, orderID, nowMs)
}

// runScriptArgs is runScript with the script's arguments as given.
func (s *Store) runScriptArgs(ctx context.Context, script *redis.Script, keys []string, args ...any) callReply {
	if s.replicas <= 0 {
		res, err := script.Run(ctx, s.rdb, keys, args...).Slice()
		return callReply{res: res, err: err}
	}
	run := func(load bool) callReply {
		pipe := s.rdb.Pipeline()
		var cmd *redis.Cmd
		if load {
			cmd = script.Eval(ctx, pipe, keys, args...)
		} else {
			cmd = script.EvalSha(ctx, pipe, keys, args...)
		}
		wait := s.waitCmd(ctx, pipe)
		_, _ = pipe.Exec(ctx) // errors are per command, read below
		res, err := cmd.Slice()
		return callReply{res: res, err: err, wait: wait}
	}
	r := run(false)
	if r.err != nil && strings.HasPrefix(r.err.Error(), "NOSCRIPT") {
		r = run(true)
	}
	return r
}

var (
	errSoldOut  = &flashsale.Error{Code: flashsale.CodeSoldOut, Message: "this item is sold out"}
	errNoItem   = &flashsale.Error{Code: flashsale.CodeNotFound, Message: "no such item"}
	errBadReply = errors.New("unexpected reply from the reserve script")
)

// ErrSoldOut is the shared SOLD_OUT error (no allocation per refusal).
func ErrSoldOut() error { return errSoldOut }

// reserveResult turns the script's reply into a domain error.
func reserveResult(res []any) error {
	if len(res) != 2 {
		return fmt.Errorf("redisstock.Reserve: %w: %v", errBadReply, res)
	}
	code, ok := res[0].(int64)
	if !ok {
		return fmt.Errorf("redisstock.Reserve: %w: %v", errBadReply, res)
	}
	switch code {
	case lua.ResultOK:
		return nil
	case lua.ResultAlready:
		id, _ := res[1].(string)
		return &flashsale.Error{Code: flashsale.CodeAlreadyPurchased, Message: "you already hold an order in this sale", OrderID: id}
	case lua.ResultSoldOut:
		return errSoldOut
	case lua.ResultNoItem:
		return errNoItem
	}
	return fmt.Errorf("redisstock.Reserve: %w: %v", errBadReply, res)
}

// Release gives the unit of orderID back, once: it reports true when the unit
// went back, false when it had been given back before (or the user's buyer
// record names another order). It also removes the order's pending member.
func (s *Store) Release(ctx context.Context, saleID, userID, itemID int64, orderID string) (bool, error) {
	if l := s.layout(saleID); l != nil {
		return s.releaseSharded(ctx, l, userID, itemID, orderID)
	}
	n, err := s.release.Run(ctx, s.rdb,
		[]string{lua.StockKey(saleID), lua.BuyersKey(saleID), lua.PendingKey(saleID)},
		userID, orderID, itemID).Int64()
	if err != nil {
		return false, fmt.Errorf("redisstock.Release: %w", err)
	}
	return n == lua.ResultReleased, nil
}

// Remaining returns itemID → remaining units of a sale.
func (s *Store) Remaining(ctx context.Context, saleID int64) (map[int64]int64, error) {
	if l := s.layout(saleID); l != nil {
		return s.remainingSharded(ctx, l)
	}
	m, err := s.rdb.HGetAll(ctx, lua.StockKey(saleID)).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstock.Remaining: %w", err)
	}
	out := make(map[int64]int64, len(m))
	for k, v := range m {
		id, err1 := strconv.ParseInt(k, 10, 64)
		n, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out[id] = n
	}
	return out, nil
}

// ItemsRemaining returns the remaining units of the given items of one sale
// (one HMGET), in the same order; a missing item reads as -1.
func (s *Store) ItemsRemaining(ctx context.Context, saleID int64, itemIDs []int64) ([]int64, error) {
	fields := make([]string, len(itemIDs))
	for i, id := range itemIDs {
		fields[i] = strconv.FormatInt(id, 10)
	}
	if l := s.layout(saleID); l != nil {
		return s.itemsRemainingSharded(ctx, l, fields)
	}
	vals, err := s.rdb.HMGet(ctx, lua.StockKey(saleID), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstock.ItemsRemaining: %w", err)
	}
	out := make([]int64, len(vals))
	for i, v := range vals {
		out[i] = -1
		if str, ok := v.(string); ok {
			if n, err := strconv.ParseInt(str, 10, 64); err == nil {
				out[i] = n
			}
		}
	}
	return out, nil
}

// Buyer is a user's live reservation in a sale as Redis knows it.
type Buyer struct {
	OrderID   string
	ItemID    int64
	CreatedAt time.Time
}

// Buyer returns the user's reservation in the sale, if any.
func (s *Store) Buyer(ctx context.Context, saleID, userID int64) (Buyer, bool, error) {
	v, err := s.rdb.HGet(ctx, s.shardKey(saleID, userID, lua.KindBuyers), strconv.FormatInt(userID, 10)).Result()
	if errors.Is(err, redis.Nil) {
		return Buyer{}, false, nil
	}
	if err != nil {
		return Buyer{}, false, fmt.Errorf("redisstock.Buyer: %w", err)
	}
	b, ok := parseBuyer(v)
	return b, ok, nil
}

// MarkPaid records that orderID of the sale was paid at paidAt (PaidKey).
func (s *Store) MarkPaid(ctx context.Context, saleID int64, orderID string, paidAt time.Time) error {
	if err := s.rdb.HSet(ctx, lua.PaidKey(saleID), strings.ToLower(orderID), paidAt.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("redisstock.MarkPaid: %w", err)
	}
	return nil
}

// Paid reports whether MarkPaid recorded orderID of the sale as paid.
func (s *Store) Paid(ctx context.Context, saleID int64, orderID string) (bool, error) {
	ok, err := s.rdb.HExists(ctx, lua.PaidKey(saleID), strings.ToLower(orderID)).Result()
	if err != nil {
		return false, fmt.Errorf("redisstock.Paid: %w", err)
	}
	return ok, nil
}

// parseBuyer reads a buyer record; a claim (a sharded sale's reservation
// still looking for a unit) is none.
func parseBuyer(v string) (Buyer, bool) {
	parts := strings.Split(v, "|")
	if len(parts) == 4 && parts[3] != "c" {
		parts = parts[:3]
	}
	if len(parts) != 3 {
		return Buyer{}, false
	}
	item, err1 := strconv.ParseInt(parts[1], 10, 64)
	ms, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return Buyer{}, false
	}
	return Buyer{OrderID: parts[0], ItemID: item, CreatedAt: time.UnixMilli(ms)}, true
}

// BuyerCount is the number of users holding a reservation in the sale
// (over every shard, counting the claims in flight).
func (s *Store) BuyerCount(ctx context.Context, saleID int64) (int64, error) {
	var total int64
	for _, k := range s.kindKeys(saleID, lua.KindBuyers) {
		n, err := s.rdb.HLen(ctx, k).Result()
		if err != nil {
			return 0, fmt.Errorf("redisstock.BuyerCount: %w", err)
		}
		total += n
	}
	return total, nil
}

// The purchase path's bounds, which whoever reads a pending reservation
// relies on: a reservation's script call is given up after
// DefaultReserveTimeout and its record's publish after
// DefaultPublishTimeout, so a record Kafka acknowledged at all was
// acknowledged within their sum of the reservation's ReservedAt. They live
// here, beside Pending, so the purchase service that keeps them and the
// reconciler that counts on them read one value.
const (
	DefaultReserveTimeout = 2 * time.Second
	DefaultPublishTimeout = 5 * time.Second
)

// Pending is a reservation not yet confirmed in PostgreSQL.
type Pending struct {
	SaleID     int64
	OrderID    string
	UserID     int64
	ItemID     int64
	ReservedAt time.Time
	// Placed reports that Kafka acknowledged the order's record at
	// Partition and Offset of the orders topic (RecordPlaced).
	Placed    bool
	Partition int32
	Offset    int64
}

// Placement is where Kafka acknowledged an order's record.
type Placement struct {
	SaleID    int64
	UserID    int64 // names the shard of a sharded sale's records
	OrderID   string
	Partition int32
	Offset    int64
}

// RecordPlaced keeps the Kafka position of acknowledged orders beside their
// pending members (one pipeline), until Confirm removes both.
func (s *Store) RecordPlaced(ctx context.Context, ps []Placement) error {
	if len(ps) == 0 {
		return nil
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range ps {
			p.HSet(ctx, s.shardKey(o.SaleID, o.UserID, lua.KindPlaced), o.OrderID, strconv.FormatInt(int64(o.Partition), 10)+":"+strconv.FormatInt(o.Offset, 10))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstock.RecordPlaced: %w", err)
	}
	return nil
}

// Confirm removes the pending members (and Kafka positions) of orders now
// committed in the database, or settled otherwise (one pipeline).
func (s *Store) Confirm(ctx context.Context, orders []Pending) error {
	if len(orders) == 0 {
		return nil
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range orders {
			p.ZRem(ctx, s.shardKey(o.SaleID, o.UserID, lua.KindPending), lua.PendingMember(o.OrderID, o.UserID, o.ItemID))
			p.HDel(ctx, s.shardKey(o.SaleID, o.UserID, lua.KindPlaced), o.OrderID)
			p.HDel(ctx, s.shardKey(o.SaleID, o.UserID, lua.KindOwners), o.OrderID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstock.Confirm: %w", err)
	}
	return nil
}

// PendingBefore returns up to limit reservations of a sale made before t and
// still unconfirmed, oldest first (over every shard).
func (s *Store) PendingBefore(ctx context.Context, saleID int64, t time.Time, limit int64) ([]Pending, error) {
	if l := s.layout(saleID); l != nil {
		return s.pendingBeforeSharded(ctx, l, saleID, t, limit)
	}
	return s.PendingBeforeFrom(ctx, saleID, 0, t, 0, limit)
}

// PendingBeforeFrom is PendingBefore on one shard of the sale (0 ≤ shard <
// Shards(saleID)) after skipping the skip oldest ones (those a caller
// leaves pending on purpose).
func (s *Store) PendingBeforeFrom(ctx context.Context, saleID int64, shard int, t time.Time, skip, limit int64) ([]Pending, error) {
	pendingKey, placedKey := lua.PendingKey(saleID), lua.PlacedKey(saleID)
	if l := s.layout(saleID); l != nil && shard > 0 && shard < l.shards {
		pendingKey, placedKey = l.key(shard, lua.KindPending), l.key(shard, lua.KindPlaced)
	}
	zs, err := s.rdb.ZRangeByScoreWithScores(ctx, pendingKey, &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(t.UnixMilli(), 10), Offset: skip, Count: limit,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstock.PendingBefore: %w", err)
	}
	out := make([]Pending, 0, len(zs))
	for _, z := range zs {
		m, _ := z.Member.(string)
		parts := strings.Split(m, "|")
		if len(parts) != 3 {
			continue
		}
		u, err1 := strconv.ParseInt(parts[1], 10, 64)
		it, err2 := strconv.ParseInt(parts[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Pending{SaleID: saleID, OrderID: parts[0], UserID: u, ItemID: it, ReservedAt: time.UnixMilli(int64(z.Score))})
	}
	if len(out) == 0 {
		return out, nil
	}
	ids := make([]string, len(out))
	for i, p := range out {
		ids[i] = p.OrderID
	}
	placed, err := s.rdb.HMGet(ctx, placedKey, ids...).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstock.PendingBefore: %w", err)
	}
	for i, v := range placed {
		str, _ := v.(string)
		part, off, ok := strings.Cut(str, ":")
		if !ok {
			continue
		}
		pn, err1 := strconv.ParseInt(part, 10, 32)
		on, err2 := strconv.ParseInt(off, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out[i].Placed, out[i].Partition, out[i].Offset = true, int32(pn), on
	}
	return out, nil
}

// Incarnation identifies the dataset Redis serves: the master's replication
// ID (INFO replication master_replid). It changes when Redis restarts
// without its data or a replica is promoted, the two ways Redis loses
// writes it acknowledged. ok is false for a Redis Cluster client, whose
// nodes each have their own.
func (s *Store) Incarnation(ctx context.Context) (id string, ok bool, err error) {
	if _, cluster := s.rdb.(*redis.ClusterClient); cluster {
		return "", false, nil
	}
	info, err := s.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return "", false, fmt.Errorf("redisstock.Incarnation: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, found := strings.CutPrefix(strings.TrimSpace(line), "master_replid:"); found {
			return v, true, nil
		}
	}
	return "", false, errors.New("redisstock.Incarnation: master_replid not in INFO")
}

// Drop deletes a sale's stock and buyer records, so that reservations of
// the sale answer "no stock record" until they are rebuilt (after Redis may
// have lost writes: a stale stock count would sell units again). For a
// sharded sale it deletes them on every shard, with the loans, claims and
// returns between shards, which the rebuild does not carry over. Holds go
// too: the rebuild counts the database's orders only, so a held unit is
// back in stock after it (see Hold).
func (s *Store) Drop(ctx context.Context, saleID int64) error {
	if l := s.layout(saleID); l != nil {
		return s.dropSharded(ctx, l)
	}
	if err := s.rdb.Del(ctx, lua.StockKey(saleID), lua.BuyersKey(saleID), lua.HoldsKey(saleID)).Err(); err != nil {
		return fmt.Errorf("redisstock.Drop: %w", err)
	}
	return nil
}

var errNoStockRecord = errors.New("no stock record for the item (Redis lost it; the reconciler rebuilds it)")

// stockAddMarkerTTL is how long a stock addition's markers stay: far
// longer than the outbox takes to retry a step (seconds), so a retry never
// adds twice.
const stockAddMarkerTTL = 7 * 24 * time.Hour

// AddStock adds units of itemID to a sale's stock in Redis for the stock
// addition addID (the outbox row of the sale store): units spread over the
// shards as Load spreads them, one atomic script per shard guarded by a
// marker of addID, so a retry of a step cut short adds nothing twice. A
// shard without the item's stock record (Redis lost it) gets nothing and
// the call fails: the caller retries after the rebuild, which leaves out
// the additions still pending.
func (s *Store) AddStock(ctx context.Context, saleID, addID, itemID, units int64) error {
	script := redis.NewScript(lua.StockAdd)
	tags := s.tags(saleID)
	shards := len(tags)
	for sh := range shards {
		n := split(units, shards, sh)
		if n == 0 {
			continue
		}
		keys := []string{lua.ShardKey(tags[sh], lua.KindStock), lua.StockAddMarker(tags[sh], addID)}
		res, err := script.Run(ctx, s.rdb, keys, itemID, n, int64(stockAddMarkerTTL/time.Second)).Int()
		if err != nil {
			return fmt.Errorf("redisstock.AddStock: shard %d: %w", sh, err)
		}
		if res == 2 {
			return fmt.Errorf("redisstock.AddStock: shard %d: %w", sh, errNoStockRecord)
		}
	}
	return nil
}

// unlockScript deletes a lock key only while it still holds the token.
var unlockScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// LockRebuild takes the sale's rebuild lock (lua.RebuildKey) for ttl under
// token; false when another token holds it. A token that holds it already
// keeps it (false too: SET NX).
func (s *Store) LockRebuild(ctx context.Context, saleID int64, token string, ttl time.Duration) (bool, error) {
	ok, err := s.rdb.SetNX(ctx, lua.RebuildKey(saleID), token, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("redisstock.LockRebuild: %w", err)
	}
	return ok, nil
}

// HoldsRebuild reports whether token still holds the sale's rebuild lock.
func (s *Store) HoldsRebuild(ctx context.Context, saleID int64, token string) (bool, error) {
	v, err := s.rdb.Get(ctx, lua.RebuildKey(saleID)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("redisstock.HoldsRebuild: %w", err)
	}
	return v == token, nil
}

// UnlockRebuild gives the sale's rebuild lock up if token holds it.
func (s *Store) UnlockRebuild(ctx context.Context, saleID int64, token string) error {
	if err := unlockScript.Run(ctx, s.rdb, []string{lua.RebuildKey(saleID)}, token).Err(); err != nil {
		return fmt.Errorf("redisstock.UnlockRebuild: %w", err)
	}
	return nil
}
