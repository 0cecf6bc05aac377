package redisstock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/lua"
)

// Placement leases. Each gateway holds a lease, a slot of the fleet's
// MaxLeaseSlots, renewed well within its time to live; every reservation
// it makes under the lease (ReserveAs, ClaimAs) names the slot in the
// shard's owners HASH (lua.KindOwners), in the same script. When a gateway
// dies or freezes, its lease lapses within the time to live, and the
// reservations it still had in flight are found by slot (Owned) and
// settled at once (reconcile.Reconciler), not after the reconcile bound.
// A lapsed lease is never renewed: a gateway that wakes up finds it lost,
// answers no 202 for what it made under it, and takes another slot. The
// slot stays taken until the reclaim has settled every reservation made
// under it and frees it (FreeLease). All times are Redis's clock, which
// stops when Redis does: every process ticks it (RunLeaseClock), and a
// gap of half a TTL between two lease ops moves every renewal forward by
// the gap, so a frozen Redis makes no lease lapse when it wakes.

// MaxLeaseSlots is the number of lease slots (slot 0 means no lease).
const MaxLeaseSlots = 4095

// Lease is a gateway's placement lease.
type Lease struct {
	Slot  int
	Token string
}

var leaseScript = redis.NewScript(lua.Lease)

var errNoLeaseSlot = errors.New("redisstock.AcquireLease: no free lease slot found")

func (s *Store) leaseOp(ctx context.Context, op string, slot int, token string, ttl time.Duration) *redis.Cmd {
	return leaseScript.Run(ctx, s.rdb, []string{lua.LeasesKey, lua.LeaseRenewalsKey, lua.LeaseClockKey}, op, slot, token, ttl.Milliseconds())
}

// LeaseTick is how often every process ticks the leases' clock
// (RunLeaseClock); a gap of half a lease TTL between two lease ops means
// Redis itself was away, and the leases' time stops for that gap.
const LeaseTick = 500 * time.Millisecond

// RunLeaseClock ticks the leases' clock every LeaseTick until ctx ends,
// for leases of the given ttl; it returns nil then. Every process with
// Redis runs it (the gateways' renewals tick it too), so the clock stops
// only when Redis stops answering everyone, not when gateways die.
func (s *Store) RunLeaseClock(ctx context.Context, ttl time.Duration) error {
	t := time.NewTicker(LeaseTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		tctx, cancel := context.WithTimeout(ctx, LeaseTick)
		_ = s.leaseOp(tctx, "tick", 0, "", ttl).Err() // a missed tick is the next one's
		cancel()
	}
}

// AcquireLease takes a free slot with a new token, renewed from now on
// with RenewLease within ttl.
func (s *Store) AcquireLease(ctx context.Context, ttl time.Duration) (Lease, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	for range 64 {
		slot := 1 + mrand.IntN(MaxLeaseSlots)
		n, err := s.leaseOp(ctx, "acquire", slot, token, ttl).Int()
		if err != nil {
			return Lease{}, fmt.Errorf("redisstock.AcquireLease: %w", err)
		}
		if n == 1 {
			return Lease{Slot: slot, Token: token}, nil
		}
	}
	return Lease{}, errNoLeaseSlot
}

// RenewLease renews l; false means it is lost (lapsed, or taken by the
// reclaim), and nothing made under it may be acknowledged any more.
func (s *Store) RenewLease(ctx context.Context, l Lease, ttl time.Duration) (bool, error) {
	n, err := s.leaseOp(ctx, "renew", l.Slot, l.Token, ttl).Int()
	if err != nil {
		return false, fmt.Errorf("redisstock.RenewLease: %w", err)
	}
	return n == 1, nil
}

// LapsedLeases returns the leases not renewed within ttl.
func (s *Store) LapsedLeases(ctx context.Context, ttl time.Duration) ([]Lease, error) {
	res, err := s.leaseOp(ctx, "lapsed", 0, "", ttl).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("redisstock.LapsedLeases: %w", err)
	}
	out := make([]Lease, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		slot, err := strconv.Atoi(res[i])
		if err != nil {
			continue
		}
		out = append(out, Lease{Slot: slot, Token: res[i+1]})
	}
	return out, nil
}

// FreeLease frees a lapsed lease's slot once every reservation made under
// it is settled; false when it is not lapsed or held by another token.
func (s *Store) FreeLease(ctx context.Context, l Lease, ttl time.Duration) (bool, error) {
	n, err := s.leaseOp(ctx, "free", l.Slot, l.Token, ttl).Int()
	if err != nil {
		return false, fmt.Errorf("redisstock.FreeLease: %w", err)
	}
	return n == 1, nil
}

// Owned is a reservation recorded under a lease slot.
type Owned struct {
	Pending
	Slot int
	// Live reports that the reservation is still pending (neither
	// confirmed by the writer nor given back, nor made a hold again by
	// Unclaim); a record that is not is stale, left by a reservation
	// given back at once.
	Live bool
}

// Owned returns the reservations of a sale recorded under one of slots,
// on every shard, with their Kafka position when one was kept.
func (s *Store) Owned(ctx context.Context, saleID int64, slots map[int]bool) ([]Owned, error) {
	var out []Owned
	for _, tag := range s.tags(saleID) {
		m, err := s.rdb.HGetAll(ctx, lua.ShardKey(tag, lua.KindOwners)).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstock.Owned: %w", err)
		}
		start := len(out)
		for orderID, v := range m {
			o, ok := parseOwner(saleID, orderID, v)
			if ok && slots[o.Slot] {
				out = append(out, o)
			}
		}
		mine := out[start:]
		if len(mine) == 0 {
			continue
		}
		pendingKey, placedKey := lua.ShardKey(tag, lua.KindPending), lua.ShardKey(tag, lua.KindPlaced)
		holdsKey := lua.ShardKey(tag, lua.KindHolds)
		scores := make([]*redis.FloatCmd, len(mine))
		held := make([]*redis.FloatCmd, len(mine))
		placed := make([]*redis.StringCmd, len(mine))
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, o := range mine {
				scores[i] = p.ZScore(ctx, pendingKey, lua.PendingMember(o.OrderID, o.UserID, o.ItemID))
				held[i] = p.ZScore(ctx, holdsKey, strconv.FormatInt(o.UserID, 10))
				placed[i] = p.HGet(ctx, placedKey, o.OrderID)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("redisstock.Owned: %w", err)
		}
		for i := range mine {
			_, serr := scores[i].Result()
			_, herr := held[i].Result()
			for _, err := range []error{serr, herr} {
				if err != nil && !errors.Is(err, redis.Nil) {
					return nil, fmt.Errorf("redisstock.Owned: %w", err)
				}
			}
			// A member of a held user is its hold again (Unclaim), not
			// the claim recorded under the lease.
			mine[i].Live = serr == nil && errors.Is(herr, redis.Nil)
			if v, err := placed[i].Result(); err == nil {
				part, off, ok := strings.Cut(v, ":")
				pn, err1 := strconv.ParseInt(part, 10, 32)
				on, err2 := strconv.ParseInt(off, 10, 64)
				if ok && err1 == nil && err2 == nil {
					mine[i].Placed, mine[i].Partition, mine[i].Offset = true, int32(pn), on
				}
			}
		}
	}
	return out, nil
}

// parseOwner reads an owners field: "slot|userId|itemId|reservedAtMs".
func parseOwner(saleID int64, orderID, v string) (Owned, bool) {
	parts := strings.Split(v, "|")
	if len(parts) != 4 {
		return Owned{}, false
	}
	slot, err0 := strconv.Atoi(parts[0])
	u, err1 := strconv.ParseInt(parts[1], 10, 64)
	it, err2 := strconv.ParseInt(parts[2], 10, 64)
	ms, err3 := strconv.ParseInt(parts[3], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil || err3 != nil {
		return Owned{}, false
	}
	return Owned{Slot: slot, Pending: Pending{SaleID: saleID, OrderID: orderID, UserID: u, ItemID: it, ReservedAt: time.UnixMilli(ms)}}, true
}

// Disown removes the owners records of settled reservations.
func (s *Store) Disown(ctx context.Context, settled []Owned) error {
	if len(settled) == 0 {
		return nil
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range settled {
			p.HDel(ctx, s.shardKey(o.SaleID, o.UserID, lua.KindOwners), o.OrderID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstock.Disown: %w", err)
	}
	return nil
}

// DropLeases deletes every placement lease: each gateway's next renewal
// finds its lease lost and takes a new one, so that nothing made under a
// lease held before the call is acknowledged later than one lease TTL after
// it (purchase.Leaser.Holds). A Redis-loss rebuild calls it when it sees
// the loss: a promoted replica or a Cluster node that kept the leases
// would let them live on. The reservations in flight under the dropped
// leases are left to the reconcile pass.
func (s *Store) DropLeases(ctx context.Context) error {
	if err := s.rdb.Del(ctx, lua.LeasesKey, lua.LeaseRenewalsKey).Err(); err != nil {
		return fmt.Errorf("redisstock.DropLeases: %w", err)
	}
	return nil
}
