package push

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// errUnavailable answers a subscription Redis could not store.
var errUnavailable = flashsale.Errorf(flashsale.CodeUnavailable, "subscriptions are not available; retry shortly")

// Store keeps the subscriptions per sale and user in Redis (lua.PushKey):
// one per user and sale, the latest wins.
type Store struct {
	rdb redis.UniversalClient
}

// NewStore returns a Store on rdb.
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// Put keeps sub as the user's subscription in the sale. expireAt, when
// not zero, is when the sale's queue keys expire (its end plus the queue
// keys' TTL): the subscriptions go with them.
func (s *Store) Put(ctx context.Context, saleID, userID int64, sub Subscription, expireAt time.Time) error {
	b, err := json.Marshal(sub)
	if err != nil {
		return fmt.Errorf("push.Store.Put: %w", err)
	}
	key := lua.PushKey(saleID)
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, key, strconv.FormatInt(userID, 10), b)
	if !expireAt.IsZero() {
		pipe.PExpireAt(ctx, key, expireAt)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("push.Store.Put: %w: %w", errUnavailable, err)
	}
	return nil
}

// Delete drops the user's subscription in the sale.
func (s *Store) Delete(ctx context.Context, saleID, userID int64) error {
	if err := s.rdb.HDel(ctx, lua.PushKey(saleID), strconv.FormatInt(userID, 10)).Err(); err != nil {
		return fmt.Errorf("push.Store.Delete: %w: %w", errUnavailable, err)
	}
	return nil
}

// Get returns the user's subscription in the sale, if any.
func (s *Store) Get(ctx context.Context, saleID, userID int64) (Subscription, bool, error) {
	m, err := s.lookup(ctx, saleID, []int64{userID})
	if err != nil {
		return Subscription{}, false, err
	}
	sub, ok := m[userID]
	return sub.Subscription, ok, nil
}

// Any reports whether any shopper of the sale subscribed.
func (s *Store) Any(ctx context.Context, saleID int64) (bool, error) {
	n, err := s.rdb.Exists(ctx, lua.PushKey(saleID)).Result()
	if err != nil {
		return false, fmt.Errorf("push.Store.Any: %w", err)
	}
	return n > 0, nil
}

// stored is a subscription with its stored form (dropIf compares it).
type stored struct {
	Subscription
	raw string
}

// lookup returns the subscriptions of users that have one.
func (s *Store) lookup(ctx context.Context, saleID int64, users []int64) (map[int64]stored, error) {
	if len(users) == 0 {
		return nil, nil
	}
	fields := make([]string, len(users))
	for i, u := range users {
		fields[i] = strconv.FormatInt(u, 10)
	}
	vals, err := s.rdb.HMGet(ctx, lua.PushKey(saleID), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("push.Store.lookup: %w", err)
	}
	out := make(map[int64]stored)
	for i, v := range vals {
		raw, ok := v.(string)
		if !ok {
			continue
		}
		var sub Subscription
		if json.Unmarshal([]byte(raw), &sub) != nil {
			continue
		}
		out[users[i]] = stored{Subscription: sub, raw: raw}
	}
	return out, nil
}

// dropIfScript deletes a user's subscription only while it is the one the
// push service refused: a shopper who subscribed again meanwhile keeps
// the new one.
var dropIfScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
`)

// dropIf deletes the user's subscription if it is still raw.
func (s *Store) dropIf(ctx context.Context, saleID, userID int64, raw string) (bool, error) {
	n, err := dropIfScript.Run(ctx, s.rdb, []string{lua.PushKey(saleID)}, strconv.FormatInt(userID, 10), raw).Int()
	if err != nil {
		return false, fmt.Errorf("push.Store.dropIf: %w", err)
	}
	return n == 1, nil
}
