package sales

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/lua"
)

// Cache is an immutable snapshot of every sale, swapped atomically, so hot
// paths look sales and items up without locks or I/O. It refreshes every
// Interval and at once when a sale is announced on Redis.
type Cache struct {
	store    *Store
	rdb      redis.UniversalClient
	log      *slog.Logger
	interval time.Duration
	snap     atomic.Pointer[snapshot]
	// started numbers the refreshes in the order they begin; stored is
	// the number of the one in snap. A refresh that began before the one
	// stored read older rows and is dropped: without it, the timer's
	// refresh, begun just before a sale was created and done just after
	// the creating gateway's own refresh, put back a snapshot without the
	// sale, and that gateway answered 404 for the sale it had just created.
	started atomic.Uint64
	mu      sync.Mutex // guards stored and the store into snap
	stored  uint64
}

type itemRef struct {
	sale *flashsale.Sale
	item flashsale.Item
}

type snapshot struct {
	sales map[int64]*flashsale.Sale
	items map[int64]itemRef
	list  []*flashsale.Sale
}

// NewCache returns an empty cache; call Refresh or Run to fill it.
func NewCache(store *Store, rdb redis.UniversalClient, interval time.Duration, logger *slog.Logger) *Cache {
	if interval <= 0 {
		interval = time.Second
	}
	c := &Cache{store: store, rdb: rdb, log: logger.With("component", "sales-cache"), interval: interval}
	c.snap.Store(&snapshot{sales: map[int64]*flashsale.Sale{}, items: map[int64]itemRef{}})
	return c
}

// Refresh reloads every sale from the database.
func (c *Cache) Refresh(ctx context.Context) (err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	n := c.started.Add(1)
	all, err := c.store.List(ctx)
	if err != nil {
		return err
	}
	s := &snapshot{sales: make(map[int64]*flashsale.Sale, len(all)), items: map[int64]itemRef{}, list: make([]*flashsale.Sale, len(all))}
	for i := range all {
		sl := &all[i]
		s.sales[sl.ID] = sl
		s.list[i] = sl
		for _, it := range sl.Items {
			s.items[it.ID] = itemRef{sale: sl, item: it}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n > c.stored {
		c.stored = n
		c.snap.Store(s)
	}
	return nil
}

// Run refreshes on a timer and on announcements until ctx ends.
func (c *Cache) Run(ctx context.Context) error {
	sub := c.rdb.Subscribe(ctx, lua.SalesChannel)
	defer sub.Close()
	msgs := sub.Channel()
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("refresh failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-msgs:
		}
	}
}

// Sale returns a sale by id. The returned value must not be modified.
func (c *Cache) Sale(id int64) (*flashsale.Sale, bool) {
	s, ok := c.snap.Load().sales[id]
	return s, ok
}

// ItemSale returns an item and its sale.
func (c *Cache) ItemSale(itemID int64) (*flashsale.Sale, flashsale.Item, bool) {
	r, ok := c.snap.Load().items[itemID]
	return r.sale, r.item, ok
}

// Sales returns every sale, newest first. The values must not be modified.
func (c *Cache) Sales() []*flashsale.Sale { return c.snap.Load().list }
