// Package redisstock is the Redis adapter for a sale's stock: the only Go code
// that runs the reservation scripts of lua/. Script return codes become
// domain errors here and nowhere else.
package redisstock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	pipe    atomic.Pointer[pipeline] // set by RunPipeline
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, reserve: redis.NewScript(lua.Reserve), release: redis.NewScript(lua.Release)}
}

// LoadScripts loads the scripts into Redis (at start; go-redis also falls
// back from EVALSHA to EVAL when Redis answers NOSCRIPT after a restart).
func (s *Store) LoadScripts(ctx context.Context) error {
	if err := s.reserve.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("redisstock.LoadScripts: %w", err)
	}
	if err := s.release.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("redisstock.LoadScripts: %w", err)
	}
	return nil
}

// Load sets the remaining stock of a sale's items (itemID → units). It is
// used when a sale is created and when stock is rebuilt from the database.
func (s *Store) Load(ctx context.Context, saleID int64, remaining map[int64]int64) error {
	if len(remaining) == 0 {
		return nil
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
	if taken, err := s.pipelined(ctx, saleID, itemID, userID, orderID, now.UnixMilli()); taken {
		return err
	}
	res, err := s.reserve.Run(ctx, s.rdb, reserveKeys(saleID), itemID, userID, orderID, now.UnixMilli()).Slice()
	if err != nil {
		return fmt.Errorf("redisstock.Reserve: %w", err)
	}
	return reserveResult(res)
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
	v, err := s.rdb.HGet(ctx, lua.BuyersKey(saleID), strconv.FormatInt(userID, 10)).Result()
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

func parseBuyer(v string) (Buyer, bool) {
	parts := strings.Split(v, "|")
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

// BuyerCount is the number of users holding a reservation in the sale.
func (s *Store) BuyerCount(ctx context.Context, saleID int64) (int64, error) {
	n, err := s.rdb.HLen(ctx, lua.BuyersKey(saleID)).Result()
	if err != nil {
		return 0, fmt.Errorf("redisstock.BuyerCount: %w", err)
	}
	return n, nil
}

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
			p.HSet(ctx, lua.PlacedKey(o.SaleID), o.OrderID, strconv.FormatInt(int64(o.Partition), 10)+":"+strconv.FormatInt(o.Offset, 10))
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
			p.ZRem(ctx, lua.PendingKey(o.SaleID), lua.PendingMember(o.OrderID, o.UserID, o.ItemID))
			p.HDel(ctx, lua.PlacedKey(o.SaleID), o.OrderID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstock.Confirm: %w", err)
	}
	return nil
}

// PendingBefore returns up to limit reservations of a sale made before t and
// still unconfirmed, oldest first.
func (s *Store) PendingBefore(ctx context.Context, saleID int64, t time.Time, limit int64) ([]Pending, error) {
	return s.PendingBeforeFrom(ctx, saleID, t, 0, limit)
}

// PendingBeforeFrom is PendingBefore after skipping the skip oldest ones
// (those a caller leaves pending on purpose).
func (s *Store) PendingBeforeFrom(ctx context.Context, saleID int64, t time.Time, skip, limit int64) ([]Pending, error) {
	zs, err := s.rdb.ZRangeByScoreWithScores(ctx, lua.PendingKey(saleID), &redis.ZRangeBy{
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
	placed, err := s.rdb.HMGet(ctx, lua.PlacedKey(saleID), ids...).Result()
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
// have lost writes: a stale stock count would sell units again).
func (s *Store) Drop(ctx context.Context, saleID int64) error {
	if err := s.rdb.Del(ctx, lua.StockKey(saleID), lua.BuyersKey(saleID)).Err(); err != nil {
		return fmt.Errorf("redisstock.Drop: %w", err)
	}
	return nil
}

// Commands returns Redis's total count of processed commands (INFO stats),
// used by benchmarks and tests to prove a path never reached Redis.
func (s *Store) Commands(ctx context.Context) (int64, error) {
	info, err := s.rdb.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("redisstock.Commands: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("redisstock.Commands: total_commands_processed not in INFO")
}
