package lua_test

import (
	"testing"

	"github.com/flashsale/flashsale/lua"
)

// The slots of Redis Cluster's specification and documentation examples.
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789":     0x31c3, // the CRC16/XMODEM check value
		"somekey":       11058,
		"foo{hash_tag}": 2515,
		"bar{hash_tag}": 2515,
	} {
		if got := lua.KeySlot(key); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if lua.KeySlot("{user1000}.following") != lua.KeySlot("user1000") {
		t.Error("a key's hash tag does not decide its slot")
	}
	if lua.KeySlot("foo{}{bar}") == lua.KeySlot("bar") {
		t.Error("an empty first tag must hash the whole key")
	}
}

// A sale's first shard, and every shard of a sale with one, uses the
// sale's own keys.
func TestShardZeroIsTheSale(t *testing.T) {
	for _, shards := range []int{0, 1, 3} {
		tag := lua.ShardTag(7, 0, shards)
		if tag != lua.Tag(7) {
			t.Errorf("ShardTag(7, 0, %d) = %q, want %q", shards, tag, lua.Tag(7))
		}
		for kind, want := range map[string]string{
			lua.KindStock: lua.StockKey(7), lua.KindBuyers: lua.BuyersKey(7), lua.KindPending: lua.PendingKey(7),
			lua.KindReserved: lua.ReservedKey(7), lua.KindPlaced: lua.PlacedKey(7),
		} {
			if got := lua.ShardKey(tag, kind); got != want {
				t.Errorf("ShardKey(%q, %q) = %q, want %q", tag, kind, got, want)
			}
		}
	}
}
