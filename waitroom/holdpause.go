package waitroom

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// A pause stops the hold clocks (queue order).
//
// While a sale is paused nobody buys, so a holder must not lose claim
// time to it: at the resume every hold whose window overlaps the pause
// ends later by that overlap. The sale's leader writes the pause's start
// in the queue state (fieldPausedAt, once: HSETNX) at its first tick that
// sees the sale paused, and its end (fieldResumedAt, once) at its first
// tick that sees it resumed; both live in Redis, so a leader change in
// between loses neither. The pause counted is the one the leader saw: the
// operator's action reaches every gateway within the sales cache's
// refresh, purchases stop and start with it.
//
// The resume's extension comes before the tick's lapse (no hold lapses
// at the resume for a window that ended during the pause), in two steps:
// each stock shard extends its holds once per pause (lua.HoldExtend,
// idempotent by a marker), then one script (shiftAdmittedScript), once,
// moves the admission records of the holders to the new window's start
// (the record's time is the window's start, so holdUntilMs and the
// token's expiry follow), clears the pause fields and bumps the holds
// generation (fieldHoldsGen). Every gateway, at each tick, compares that
// generation with the one it saw and, when it moved, reads the records of
// its admitted connections again and sends a fresh admitted message
// (token and holdUntilMs) to those whose window moved; a polling holder
// gets them at its next poll, which reads the record.

// Queue state fields (wr:{sN}:state) of the pause and of the holds.
const (
	fieldPausedAt  = "pausedat"
	fieldResumedAt = "resumedat"
	// fieldHoldsGen grows by one whenever the leader changes the
	// admission records of holders (a pause's extension, holds rebuilt
	// after a Redis loss): the gateways then read them again.
	fieldHoldsGen = "holdsgen"
)

// PauseHolds is the part of Holds that keeps the holds across a pause.
type PauseHolds interface {
	// ExtendHolds adds to each hold of the sale the overlap of its window
	// with [pausedAt, resumedAt), once per pause, and returns how many it
	// extended.
	ExtendHolds(ctx context.Context, saleID int64, pausedAt, resumedAt time.Time, window time.Duration) (int, error)
	// HoldEnds returns the end of every hold of the sale, by user.
	HoldEnds(ctx context.Context, saleID int64) (map[int64]time.Time, error)
}

// pauseHolds is the leader's pause bookkeeping of a queue sale, before
// anything lapses: it records the pause's start and, once the sale is
// resumed, extends the holds by the pause.
func (r *Room) pauseHolds(ctx context.Context, sale *flashsale.Sale, now time.Time) error {
	state := lua.QueueKey(sale.ID, keyState)
	vals, err := r.rdb.HMGet(ctx, state, fieldPausedAt, fieldResumedAt).Result()
	if err != nil {
		return fmt.Errorf("waitroom.pauseHolds: %w", err)
	}
	pausedAt, paused := msField(vals[0])
	resumedAt, resumed := msField(vals[1])
	if sale.Paused {
		if paused && resumed {
			// Paused again before the last resume was applied: apply it
			// first, then count the new pause from now.
			if err := r.extendHolds(ctx, sale, pausedAt, resumedAt); err != nil {
				return err
			}
			paused = false
		}
		if !paused {
			if err := r.rdb.HSetNX(ctx, state, fieldPausedAt, now.UnixMilli()).Err(); err != nil {
				return fmt.Errorf("waitroom.pauseHolds: %w", err)
			}
		}
		return nil
	}
	if !paused {
		return nil
	}
	if !resumed {
		if err := r.rdb.HSetNX(ctx, state, fieldResumedAt, now.UnixMilli()).Err(); err != nil {
			return fmt.Errorf("waitroom.pauseHolds: %w", err)
		}
		// Another leader's resume, if it wrote first, is the one.
		ms, err := r.rdb.HGet(ctx, state, fieldResumedAt).Int64()
		if err != nil {
			return fmt.Errorf("waitroom.pauseHolds: %w", err)
		}
		resumedAt = time.UnixMilli(ms)
	}
	return r.extendHolds(ctx, sale, pausedAt, resumedAt)
}

// extendHolds applies the pause [pausedAt, resumedAt) to the holds and
// then to the holders' admission records.
func (r *Room) extendHolds(ctx context.Context, sale *flashsale.Sale, pausedAt, resumedAt time.Time) error {
	ph, ok := r.cfg.Holds.(PauseHolds)
	if !ok {
		return errors.New("waitroom.extendHolds: the configured Holds cannot extend holds")
	}
	n, err := ph.ExtendHolds(ctx, sale.ID, pausedAt, resumedAt, sale.Window())
	if err != nil {
		return fmt.Errorf("waitroom.extendHolds: %w", err)
	}
	ends, err := ph.HoldEnds(ctx, sale.ID)
	if err != nil {
		return fmt.Errorf("waitroom.extendHolds: %w", err)
	}
	args := make([]any, 0, 2+2*len(ends))
	args = append(args, r.id, pausedAt.UnixMilli())
	for u, end := range ends {
		args = append(args, u, end.Add(-sale.Window()).UnixMilli())
	}
	done, err := shiftAdmittedScript.Run(ctx, r.rdb, saleKeys(sale.ID, keyState, keyLease, keyAdmitted), args...).Int()
	if err != nil {
		return fmt.Errorf("waitroom.extendHolds: %w", err)
	}
	if done == 1 {
		r.log.Info("holds extended by the pause", "sale", sale.ID, "pausedMs", resumedAt.Sub(pausedAt).Milliseconds(), "holds", n)
	}
	return nil
}

// shiftAdmittedScript moves the admission records of holders to the start
// of their (extended) windows, once per pause and only for the lease's
// holder: it clears the pause fields and bumps the holds generation. A
// record only moves later: a hold's end never comes earlier.
//
//	KEYS: state, lease, admitted
//	ARGV: me, pausedAtMs, userId, windowStartMs, ...
//	returns 1 applied, 0 not (lease lost, or applied before)
var shiftAdmittedScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], '` + fieldPausedAt + `') ~= ARGV[2] then return 0 end
for i = 3, #ARGV, 2 do
  local rec = redis.call('HGET', KEYS[3], ARGV[i])
  if rec then
    local place, at = string.match(rec, '^(%-?%d+)|(%d+)$')
    if place and tonumber(ARGV[i + 1]) > tonumber(at) then
      redis.call('HSET', KEYS[3], ARGV[i], place .. '|' .. ARGV[i + 1])
    end
  end
end
redis.call('HDEL', KEYS[1], '` + fieldPausedAt + `', '` + fieldResumedAt + `')
redis.call('HINCRBY', KEYS[1], '` + fieldHoldsGen + `', 1)
return 1
`)

// msField reads a state field holding Unix milliseconds.
func msField(v any) (time.Time, bool) {
	s, ok := v.(string)
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// reissueHolds sends a fresh admitted message (token, holdUntilMs,
// heldItemId) to this gateway's admitted connections of a queue sale
// once the leader changed the holds (fieldHoldsGen: a pause extended
// them, or they were rebuilt after a Redis loss), to every holder whose
// window is open, its hold changed or not: a holder whose purchase was
// refused while the holds were gone (NOT_ADMITTED, as the page and the
// load tool then wait for their turn again) learns it holds a unit again.
// A record whose window is over by then (a hold that could not be
// rebuilt) is taken as is: the next broadcast sends its shopper back in
// line.
func (r *Room) reissueHolds(ctx context.Context, sr *saleRoom, now time.Time) {
	sr.mu.Lock()
	sale := sr.sale
	sr.mu.Unlock()
	if sale == nil || !sale.QueueOrder() {
		return
	}
	gen, err := r.rdb.HGet(ctx, lua.QueueKey(sr.id, keyState), fieldHoldsGen).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.log.Warn("read the holds generation", "sale", sr.id, "err", err)
		return
	}
	sr.mu.Lock()
	if gen == sr.holdsGen {
		sr.mu.Unlock()
		return
	}
	var conns []*conn
	var users []string
	for c := range sr.conns {
		if c.admittedAt != 0 && !c.bought {
			conns = append(conns, c)
			users = append(users, strconv.FormatInt(c.user, 10))
		}
	}
	sr.mu.Unlock()
	var recs, items []any
	if len(users) > 0 {
		pipe := r.rdb.Pipeline()
		recCmd := pipe.HMGet(ctx, lua.QueueKey(sr.id, keyAdmitted), users...)
		itemCmd := pipe.HMGet(ctx, lua.QueueKey(sr.id, keyHeldItem), users...)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			r.log.Warn("read holders' admission records", "sale", sr.id, "err", err)
			return
		}
		recs, items = recCmd.Val(), itemCmd.Val()
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.holdsGen = gen
	if len(recs) != len(conns) || len(items) != len(conns) {
		return
	}
	opens := sr.sale.StartsAt.UnixMilli()
	ttl := r.ttl(sr.sale).Milliseconds()
	for i, c := range conns {
		s, ok := recs[i].(string)
		if !ok || c.admittedAt == 0 || c.bought {
			continue
		}
		at := toInt(s[strings.LastIndexByte(s, '|')+1:])
		item := c.heldItem
		if v, ok := items[i].(string); ok {
			item = toInt(v)
		}
		if at == 0 {
			continue
		}
		c.admittedAt, c.heldItem = at, item
		if now.UnixMilli() >= at+ttl {
			continue
		}
		c.last = view{state: StateAdmitted, out: sr.out}
		c.push(c.last, opens, r.admittedMessage(sr, c.user, at, item))
	}
}
