// Package lua embeds the reservation scripts (reserve, release, and the
// shard_*.lua ones of a sale whose stock is split over shards), the hold
// scripts of a sale allocated in queue order (hold_*.lua), the live
// stock addition (stock_add.lua) and names
// a sale's stock and order keys, the tag and prefix of the waiting room's
// keys (QueueKey), the shoppers' push subscriptions (PushKey) and the
// pub/sub channels of settings and sales. The
// waiting room's key suffixes, wr:active and its scripts are in
// waitroom/store.go; the proof-of-work spent markers (fs:pow:spent:) are in
// defense/pow.go. All keys of one sale share the hash tag {s<saleID>}, so
// each script touches a single Redis Cluster slot; a sale whose stock is
// split over shards (Sale.StockShards > 1) has its reservation keys under
// one tag per shard (ShardTag), each script still on a single slot.
package lua

import (
	_ "embed"
	"strconv"
	"strings"
)

// Reserve atomically checks the buyer, checks and decrements the stock and
// records the reservation as pending.
//
//	KEYS: stock, buyers, pending, reserved [, owners]
//	ARGV: itemId, userId, orderId, nowMs [, lease slot]
//	returns {0, orderId} reserved, {1, existingOrderId} already purchased,
//	{2, ""} sold out, {3, ""} unknown item.
//
//go:embed reserve.lua
var Reserve string

// Release gives one unit back, only if it removes the buyer record of this
// very order (so it never gives the same order's unit back twice).
//
//	KEYS: stock, buyers, pending
//	ARGV: userId, orderId, itemId
//	returns 1 when the unit went back, 0 when it had been given back already.
//
//go:embed release.lua
var Release string

// The scripts of a sale whose stock is split over shards (see
// internal/adapter/redisstock for the protocol they make up). A sale with
// one shard runs Reserve and Release only.
var (
	// ShardReserve is Reserve on the user's home shard, except that a dry
	// home shard records a claim and answers ResultClaimed.
	//
	//	KEYS: stock, buyers, pending, reserved, claims
	//	ARGV: itemId, userId, orderId, nowMs
	//	returns Reserve's codes, {4, ""} claimed, {5, ""} a claim of the
	//	user is in flight.
	//
	//go:embed shard_reserve.lua
	ShardReserve string
	// ShardTake takes a unit on a donor shard as a loan to an order.
	//
	//	KEYS: stock, loans
	//	ARGV: itemId, orderId, userId, nowMs
	//	returns 0 taken, 2 no stock here, 3 no stock record.
	//
	//go:embed shard_take.lua
	ShardTake string
	// ShardSettle turns the order's claim into a reservation on loan.
	//
	//	KEYS: buyers, pending, reserved, claims
	//	ARGV: userId, orderId, itemId, claim's nowMs, donor shard
	//	returns 0 settled, 1 no such claim.
	//
	//go:embed shard_settle.lua
	ShardSettle string
	// ShardAbandon removes the order's claim.
	//
	//	KEYS: buyers, claims
	//	ARGV: userId, orderId, itemId
	//	returns 1 abandoned (no claim of it left), 0 it holds a unit.
	//
	//go:embed shard_abandon.lua
	ShardAbandon string
	// ShardRelease is Release on the user's home shard.
	//
	//	KEYS: stock, buyers, pending, returning
	//	ARGV: userId, orderId, itemId
	//	returns {1, ""} back here, {0, ""} given back before, {2, donor}
	//	owed to the donor shard, {4, ""} a claim in flight.
	//
	//go:embed shard_release.lua
	ShardRelease string
	// ShardGive gives a loaned unit back to its donor, once.
	//
	//	KEYS: stock, loans
	//	ARGV: orderId, itemId
	//	returns 1 given back, 0 no such loan.
	//
	//go:embed shard_give.lua
	ShardGive string
)

// HoldClaim is a holder's purchase: the user's hold becomes a reservation
// bought now, if its claim window has not ended (hold_claim.lua).
//
//	KEYS: buyers, pending, holds [, owners] (the user's home shard)
//	ARGV: userId, itemId, nowMs [, lease slot]
//	returns {0, orderId, untilMs} claimed, {1, orderId} bought before,
//	{6, ""} no hold, {7, orderId} window over, {8, heldItemId} another item.
//
//go:embed hold_claim.lua
var HoldClaim string

// HoldUnclaim makes a claimed order whose publish failed the user's hold
// again, until the same window's end (hold_unclaim.lua).
//
//	KEYS: buyers, pending, holds (the user's home shard)
//	ARGV: userId, orderId, untilMs
//	returns 1 held again, 0 nothing to undo.
//
//go:embed hold_unclaim.lua
var HoldUnclaim string

// HoldLapse ends a hold whose claim window is over and gives its unit
// back (hold_lapse.lua).
//
//	KEYS: stock, buyers, pending, returning, holds (the user's home shard)
//	ARGV: userId, nowMs
//	returns {0} no hold, {5} not due, {1, orderId, itemId} back here,
//	{2, orderId, itemId, donor} owed to the donor shard.
//
//go:embed hold_lapse.lua
var HoldLapse string

// HoldExtend extends a shard's holds by the time the sale was paused,
// once per pause (hold_extend.lua).
//
//	KEYS: holds, buyers, pending, marker (KindHoldPause) of one shard
//	ARGV: pausedAtMs, resumedAtMs, windowMs
//	returns the number of holds extended.
//
//go:embed hold_extend.lua
var HoldExtend string

// Lease acquires, renews, lists and frees the gateways' placement leases
// (lease.lua), on Redis's clock.
//
//	KEYS: LeasesKey, LeaseRenewalsKey, LeaseClockKey
//	ARGV: op (acquire, renew, lapsed, free, tick), slot, token, ttlMs
//
//go:embed lease.lua
var Lease string

// The placement leases' keys, under one tag of their own.
const (
	// LeasesKey is a HASH slot → token of the gateways' leases.
	LeasesKey = "fs:{leases}:tokens"
	// LeaseRenewalsKey is a ZSET slot scored by its last renewal (ms,
	// Redis TIME).
	LeaseRenewalsKey = "fs:{leases}:renewals"
	// LeaseClockKey is a STRING: the time (ms, Redis TIME) of the last
	// lease op, kept by every process's tick.
	LeaseClockKey = "fs:{leases}:clock"
)

// Result codes of the hold scripts beside the Reserve ones.
const (
	ResultNoHold    = 6 // HoldClaim: the user holds no unit
	ResultLapsed    = 7 // HoldClaim: the claim window is over
	ResultOtherItem = 8 // HoldClaim: the hold is of another item
	ResultNotDue    = 5 // HoldLapse: the window is not over
)

// StockAdd adds units to one shard's stock of an item, once per marker.
//
//	KEYS: stock, marker (StockAddMarker, under the same tag)
//	ARGV: itemId, units, markerTtlSeconds
//	returns 1 added, 0 added before (the marker exists), 2 no stock
//	record (nothing added, no marker: retried once the stock is rebuilt).
//
//go:embed stock_add.lua
var StockAdd string

// StockAddMarker is the STRING that records, under a shard's tag, that
// stock addition addID reached that shard.
func StockAddMarker(tag string, addID int64) string {
	return "fs:" + tag + ":added:" + strconv.FormatInt(addID, 10)
}

// Result codes of the shard scripts beside the Reserve/Release ones.
const (
	ResultClaimed  = 4 // ShardReserve: home shard dry, claim recorded
	ResultBusy     = 5 // ShardReserve: the user's claim is in flight
	ResultOwed     = 2 // ShardRelease: the unit is owed to a donor
	ResultInFlight = 4 // ShardRelease: the order is still a claim
)

// Reserve/Release result codes.
const (
	ResultOK       = 0
	ResultAlready  = 1
	ResultSoldOut  = 2
	ResultNoItem   = 3
	ResultReleased = 1
)

// Tag is the hash tag of a sale's keys.
func Tag(saleID int64) string { return "{s" + strconv.FormatInt(saleID, 10) + "}" }

// StockKey is a HASH itemId → remaining units.
func StockKey(saleID int64) string { return "fs:" + Tag(saleID) + ":stock" }

// BuyersKey is a HASH userId → "orderId|itemId|createdAtMs": the one live
// reservation per user per sale.
func BuyersKey(saleID int64) string { return "fs:" + Tag(saleID) + ":buyers" }

// PendingKey is a ZSET of "orderId|userId|itemId" scored by reservation time
// (ms): reservations not yet confirmed in PostgreSQL. The writer removes a
// member after the database commit; the reconciler returns members that stay
// too long.
func PendingKey(saleID int64) string { return "fs:" + Tag(saleID) + ":pending" }

// ReservedKey is a STRING counter of every reservation ever made in the
// sale (it never goes down: returned units do not decrement it). The
// waiting room's capacity cap reads it to know how many admitted shoppers
// have bought, whatever came back to stock meanwhile.
func ReservedKey(saleID int64) string { return "fs:" + Tag(saleID) + ":reserved" }

// PlacedKey is a HASH orderId → "partition:offset": where Kafka acknowledged
// the order's record, kept beside the pending member until the writer
// confirms the order, so the reconciler can tell a record the writer has not
// reached yet (never lost) from one that never reached the broker.
func PlacedKey(saleID int64) string { return "fs:" + Tag(saleID) + ":placed" }

// PaidKey is a HASH orderId → paidAtMs of the sale's paid orders, written
// after the payment's database commit, so that an order can be answered as
// PAID from Redis while PostgreSQL is unreachable.
func PaidKey(saleID int64) string { return "fs:" + Tag(saleID) + ":paid" }

// RebuildKey is a STRING, the token of the reconciler rebuilding the
// sale's stock after Redis lost it (reconcile/rebuild.go), with a TTL: one
// rebuild at a time, so that a fence and a count are never made for items
// another rebuild has restored.
func RebuildKey(saleID int64) string { return "fs:" + Tag(saleID) + ":rebuild" }

// HoldsKey is the holds ZSET of a sale with one shard (KindHolds).
func HoldsKey(saleID int64) string { return "fs:" + Tag(saleID) + ":holds" }

// PendingMember is the member of PendingKey for one reservation.
func PendingMember(orderID string, userID, itemID int64) string {
	return orderID + "|" + strconv.FormatInt(userID, 10) + "|" + strconv.FormatInt(itemID, 10)
}

// BuyerValue is the value of a BuyersKey field.
func BuyerValue(orderID string, itemID, createdAtMs int64) string {
	return orderID + "|" + strconv.FormatInt(itemID, 10) + "|" + strconv.FormatInt(createdAtMs, 10)
}

// Stock shards.

// Key kinds of a shard: the shard's key of a kind is ShardKey(tag, kind).
// A sale's first shard (0) has the tag Tag(saleID), so its keys are the
// ones named above (ShardKey(Tag(id), KindStock) == StockKey(id)).
const (
	KindStock    = "stock"    // as StockKey: the shard's units
	KindBuyers   = "buyers"   // as BuyersKey, for the users whose home is the shard; a value with a fourth part names the donor shard of its unit, or is a claim (c)
	KindPending  = "pending"  // as PendingKey, for the shard's buyers
	KindReserved = "reserved" // as ReservedKey, counting the shard's buyers
	KindPlaced   = "placed"   // as PlacedKey, for the shard's buyers
	// KindLoans is a HASH orderId → "userId|itemId|createdAtMs": units of
	// this shard held by orders of other shards.
	KindLoans = "loans"
	// KindClaims is a ZSET "orderId|userId|itemId" scored by ms: claims of
	// the shard's buyers looking for a unit on another shard.
	KindClaims = "claims"
	// KindReturning is a HASH orderId → "donor|itemId": released units on
	// loan not yet taken back by their donor.
	KindReturning = "returning"
	// KindHolds is a ZSET userId scored by the end of the claim window
	// (ms): the shard's buyers whose reservation is a hold made for them at
	// their turn of a sale allocated in queue order, not yet bought.
	KindHolds = "holds"
	// KindHoldPause is a STRING: the start (ms) of the last pause whose
	// time was added to the shard's holds (HoldExtend).
	KindHoldPause = "holdpause"
	// KindOwners is a HASH orderId → "slot|userId|itemId|reservedAtMs":
	// the placement lease (lease.lua) of the gateway that made a
	// reservation still pending, written by the reserve or claim script,
	// removed by Confirm or by the reclaim of a lapsed lease.
	KindOwners = "owners"
)

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// ShardKey is the key of a kind under a shard's tag.
func ShardKey(tag, kind string) string { return "fs:" + tag + ":" + kind }

// ShardTag is the hash tag of shard shard (0 ≤ shard < shards) of a sale.
// Shard 0 has the sale's tag. The slot ring is cut into shards equal arcs
// [j·16384/shards, (j+1)·16384/shards); shard 0's slot lies in arc a, and
// shard k > 0 takes arc (a + k) mod shards: its tag is the first of
// "{s<id>.<k>}", "{s<id>.<k>.1}", "{s<id>.<k>.2}", … whose slot lies in the
// middle half of that arc, away from its edges. So the shards of a sale sit
// on distinct slots, and on distinct masters of a cluster whose masters
// hold equal contiguous slot ranges, as `redis-cli --cluster create` gives
// them, when shards is the number of masters.
func ShardTag(saleID int64, shard, shards int) string {
	if shard <= 0 || shards <= 1 {
		return Tag(saleID)
	}
	arc := (KeySlot(Tag(saleID))*shards/Slots + shard) % shards
	lo, hi := arc*Slots/shards, (arc+1)*Slots/shards
	q := (hi - lo) / 4
	base := "{s" + strconv.FormatInt(saleID, 10) + "." + strconv.Itoa(shard)
	tag := base + "}"
	for i := 1; i < 1<<16; i++ {
		if s := KeySlot(tag); s >= lo+q && s < hi-q {
			return tag
		}
		tag = base + "." + strconv.Itoa(i) + "}"
	}
	// Not reached for shards ≤ 16 (a random slot lands in a given middle
	// half with probability 1/(2·shards)); any tag of the arc would do.
	return tag
}

// HomeShard is the shard of a sale with shards shards that holds userID's
// buyer record, so that one script decides the user's one purchase. The
// user id is mixed (splitmix64's finaliser) so that consecutive ids spread
// evenly.
func HomeShard(userID int64, shards int) int {
	if shards <= 1 {
		return 0
	}
	z := uint64(userID) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int(z % uint64(shards))
}

// KeySlot is the Redis Cluster slot of a key (CRC16/XMODEM of the key, or
// of its hash tag, modulo Slots), as CLUSTER KEYSLOT answers it.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % Slots
}

// Queue keys (waiting room), all under the sale's tag.

// QueueKey returns the waiting-room key with the given suffix, e.g.
// QueueKey(7, "seq") = "wr:{s7}:seq".
func QueueKey(saleID int64, suffix string) string { return "wr:" + Tag(saleID) + ":" + suffix }

// Global (untagged) keys.
const (
	// SettingsChannel is the pub/sub channel announcing a settings change.
	SettingsChannel = "fs:settings"
	// SalesChannel announces a sale created or changed.
	SalesChannel = "fs:sales"
)

// PushKey is the HASH userId → Web Push subscription (JSON) of a sale's
// shoppers (push.Store writes and reads it; the waiting room expires it
// with the queue keys and its leader asks whether it is empty before it
// looks up whom it admitted).
func PushKey(saleID int64) string { return QueueKey(saleID, "push") }
