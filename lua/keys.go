// Package lua embeds the reservation scripts (reserve, release) and names
// a sale's stock and order keys, the tag and prefix of the waiting room's
// keys (QueueKey) and the pub/sub channels of settings and sales. The
// waiting room's key suffixes, wr:active and its scripts are in
// waitroom/store.go; the proof-of-work spent markers (fs:pow:spent:) are in
// defense/pow.go. All keys of one sale share the hash tag {s<saleID>}, so
// each script touches a single Redis Cluster slot.
package lua

import (
	_ "embed"
	"strconv"
)

// Reserve atomically checks the buyer, checks and decrements the stock and
// records the reservation as pending.
//
//	KEYS: stock, buyers, pending, reserved
//	ARGV: itemId, userId, orderId, nowMs
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

// PendingMember is the member of PendingKey for one reservation.
func PendingMember(orderID string, userID, itemID int64) string {
	return orderID + "|" + strconv.FormatInt(userID, 10) + "|" + strconv.FormatInt(itemID, 10)
}

// BuyerValue is the value of a BuyersKey field.
func BuyerValue(orderID string, itemID, createdAtMs int64) string {
	return orderID + "|" + strconv.FormatInt(itemID, 10) + "|" + strconv.FormatInt(createdAtMs, 10)
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
