package waitroom

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/lua"
)

// Item choice in a sale allocated in queue order.
//
// A shopper with a ticket may choose the item held for them at their turn
// (Choose), and change it until the turn: the choice is kept in
// wr:{sN}:choice. The leader reads the choices of the places it is about
// to serve and fixes them in one script (fixChoicesScript), so that a
// choose that comes while the leader holds a unit is refused rather than
// accepted and then not honoured; the fix is lifted for every place the
// pass did not admit. A shopper with no choice gets the first item with a
// unit free, so a one-item sale needs no choice.
//
// A shopper whose chosen item has no unit free at their turn keeps the
// place: the cursor passes them (wr:{sN}:passed, user → place) and they
// are listed in wr:{sN}:wants under the item they want, by place. At each
// tick the leader serves those listed under an item with units free
// before any new place, earliest place first, so a unit that comes back
// goes to the earliest place that wants it, and a passed shopper who
// switches to an item with units free gets one at the next tick. A choose
// moves a passed shopper's listing to the new item in the same script.

const (
	keyChoice = "choice"
	keyFixed  = "fixed"
	keyPassed = "passed"
	keyWants  = "wants"
)

// wantsMemberLua builds a member of wr:{sN}:wants: the item and the place,
// each zero-padded to 20 digits, and the user, so that the members wanted
// for one item sort by place (ZRANGEBYLEX) with all scores 0.
const wantsMemberLua = `
local function pad(s)
  s = tostring(s)
  return string.rep('0', 20 - #s) .. s
end
local function wants(item, place, uid)
  return pad(item) .. ':' .. pad(place) .. ':' .. uid
end
`

// wantsPrefix is the ZRANGEBYLEX range of the members of item.
func wantsPrefix(item int64) (lo, hi string) {
	s := strconv.FormatInt(item, 10)
	for len(s) < 20 {
		s = "0" + s
	}
	return "[" + s + ":", "[" + s + ";"
}

// chooseScript records a shopper's choice: only for a shopper with a
// ticket who has no admission record (no hold) and whose place the leader
// is not serving now.
//
//	KEYS: tickets, admitted, choice, fixed, passed, wants
//	ARGV: userId, itemId, nowMs
//	returns 1 recorded, 0 the turn came (CHOICE_CLOSED), -1 no ticket
var chooseScript = redis.NewScript(wantsMemberLua + `
local uid = ARGV[1]
if redis.call('HEXISTS', KEYS[1], uid) == 0 then return -1 end
if redis.call('HEXISTS', KEYS[2], uid) == 1 then return 0 end
local fixed = redis.call('HGET', KEYS[4], uid)
if fixed and tonumber(fixed) > tonumber(ARGV[3]) then return 0 end
local old = redis.call('HGET', KEYS[3], uid)
redis.call('HSET', KEYS[3], uid, ARGV[2])
local place = redis.call('HGET', KEYS[5], uid)
if place then
  if old then redis.call('ZREM', KEYS[6], wants(old, place, uid)) end
  redis.call('ZADD', KEYS[6], 0, wants(ARGV[2], place, uid))
end
return 1
`)

var (
	errChoiceClosed = flashsale.Errorf(flashsale.CodeChoiceClosed, "your turn has come: the item held for you is fixed")
	errNoChoice     = flashsale.Errorf(flashsale.CodeInvalid, "this sale has no choice of item: it is bought in a race")
	errNotItem      = flashsale.Errorf(flashsale.CodeInvalid, "itemId: not an item of this sale")
)

// Choose records userID's choice of itemID in a sale allocated in queue
// order. Errors: NOT_FOUND (no such sale, or the user has not joined),
// INVALID (a race sale, or an item not of the sale), CHOICE_CLOSED (the
// turn came: a unit is held, or is being held, for the user), or internal.
// A refused choice changes nothing.
func (r *Room) Choose(ctx context.Context, p flashsale.Principal, saleID, itemID int64) (err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	sale, ok := r.sales.Sale(saleID)
	if !ok {
		return notFound()
	}
	if !sale.QueueOrder() {
		return errNoChoice
	}
	if !saleHasItem(sale, itemID) {
		return errNotItem
	}
	n, err := chooseScript.Run(ctx, r.rdb, saleKeys(saleID, keyTickets, keyAdmitted, keyChoice, keyFixed, keyPassed, keyWants),
		p.UserID, itemID, r.cfg.Now().UnixMilli()).Int()
	if err != nil {
		return fmt.Errorf("waitroom.Choose: %w", err)
	}
	switch n {
	case 1:
		return nil
	case 0:
		return errChoiceClosed
	}
	// A shadowed shopper's choice is taken as anyone's, and kept nowhere.
	if _, shadowed, err := r.shadowTicket(ctx, saleID, p.UserID); err != nil || shadowed {
		return err
	}
	return flashsale.Errorf(flashsale.CodeNotFound, "not in this sale's queue; join first")
}

// checkChoice is Choose's check of the sale and item alone, for a
// shadowed connection's choice, which goes nowhere.
func checkChoice(sale *flashsale.Sale, itemID int64) error {
	if !sale.QueueOrder() {
		return errNoChoice
	}
	if !saleHasItem(sale, itemID) {
		return errNotItem
	}
	return nil
}

func saleHasItem(sale *flashsale.Sale, itemID int64) bool {
	for _, it := range sale.Items {
		if it.ID == itemID {
			return true
		}
	}
	return false
}

// readChoice returns userID's choice (0: none).
func readChoice(ctx context.Context, rdb redis.UniversalClient, saleID, userID int64) (int64, error) {
	v, err := rdb.HGet(ctx, lua.QueueKey(saleID, keyChoice), strconv.FormatInt(userID, 10)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("waitroom.readChoice: %w", err)
	}
	return v, nil
}

// fixChoicesScript fixes the choices of the users the leader is about to
// serve and returns them: a choose refuses from now until the pass lifts
// the fix (admitHeldScript), or until untilMs when the pass never ends.
// Only for the lease's holder.
//
//	KEYS: lease, choice, fixed
//	ARGV: me, untilMs, userId...
//	returns {itemId or false ...}, or -1 when not the leader
var fixChoicesScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local out = {}
for i = 3, #ARGV do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[2])
  out[#out + 1] = redis.call('HGET', KEYS[2], ARGV[i])
end
return out
`)

// errNotLeader: the lease moved to another gateway during a pass.
var errNotLeader = errors.New("waitroom: not the sale's leader")

// fixChoices runs fixChoicesScript; choices[i] is users[i]'s (0: none).
func fixChoices(ctx context.Context, rdb redis.UniversalClient, saleID int64, me string, untilMs int64, users []int64) ([]int64, error) {
	args := make([]any, 0, 2+len(users))
	args = append(args, me, untilMs)
	for _, u := range users {
		args = append(args, u)
	}
	res, err := fixChoicesScript.Run(ctx, rdb, saleKeys(saleID, keyLease, keyChoice, keyFixed), args...).Result()
	if err != nil {
		return nil, fmt.Errorf("waitroom.fixChoices: %w", err)
	}
	vals, ok := res.([]any)
	if !ok {
		return nil, errNotLeader
	}
	out := make([]int64, len(users))
	for i := range out {
		if i < len(vals) {
			out[i] = toInt(vals[i])
		}
	}
	return out, nil
}

// passedWanting returns, in place order, up to limit passed users who want
// item: their ids and places.
func passedWanting(ctx context.Context, rdb redis.UniversalClient, saleID, item, limit int64) (users, places []int64, err error) {
	lo, hi := wantsPrefix(item)
	ms, err := rdb.ZRangeByLex(ctx, lua.QueueKey(saleID, keyWants), &redis.ZRangeBy{Min: lo, Max: hi, Count: limit}).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("waitroom.passedWanting: %w", err)
	}
	for _, m := range ms {
		// item:place:user, each a decimal.
		if len(m) < 42 {
			continue
		}
		place, err1 := strconv.ParseInt(m[21:41], 10, 64)
		u, err2 := strconv.ParseInt(m[42:], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		users, places = append(users, u), append(places, place)
	}
	return users, places, nil
}
