package wiring

import (
	"context"
	"encoding/json"
	"net/netip"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/access"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/push"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/static"
	"github.com/flashsale/flashsale/waitroom"
)

// queueAdapter presents the waiting room as the gateway's Queue (whose
// polling answers are any JSON value).
type queueAdapter struct{ *waitroom.Room }

func (q queueAdapter) Join(ctx context.Context, p flashsale.Principal, saleID int64, ip netip.Addr, pow json.RawMessage, code string) (any, error) {
	return q.Room.Join(ctx, p, saleID, ip, pow, code)
}

func (q queueAdapter) Status(ctx context.Context, p flashsale.Principal, saleID int64) (any, error) {
	return q.Room.Status(ctx, p, saleID)
}

func (q queueAdapter) ShadowList(ctx context.Context, saleID int64, limit int) (any, error) {
	return q.Room.ShadowList(ctx, saleID, limit)
}

// staticAdapter presents the embedded site as the gateway's StaticFiles.
type staticAdapter struct{ site *static.Site }

func (s staticAdapter) Lookup(path string) (gateway.StaticFile, bool) {
	f, ok := s.site.Lookup(path)
	if !ok {
		return gateway.StaticFile{}, false
	}
	return gateway.StaticFile{Body: f.Body, Gzip: f.Gzip, ContentType: f.ContentType, ETag: f.ETag, GzipETag: f.GzipETag, CacheControl: f.CacheControl}, true
}

// saleAdmin is the sale store as the operator API sees it: a change is in
// this gateway's cache before the answer goes out (other gateways follow
// through the announcement, or their refresh within a second).
// reportAdapter is the report's two halves: the room's roll-up and the
// orders' figures.
type reportAdapter struct {
	*waitroom.PGReport
	*sales.Store
}

type saleAdmin struct {
	*sales.Store
	cache *sales.Cache
}

func (s saleAdmin) Create(ctx context.Context, in flashsale.Sale) (flashsale.Sale, error) {
	out, err := s.Store.Create(ctx, in)
	if err != nil {
		return out, err
	}
	return out, s.cache.Refresh(ctx)
}

func (s saleAdmin) Act(ctx context.Context, id int64, a flashsale.SaleAction) (flashsale.Sale, error) {
	out, err := s.Store.Act(ctx, id, a)
	if err != nil {
		return out, err
	}
	return out, s.cache.Refresh(ctx)
}

func (s saleAdmin) Update(ctx context.Context, id int64, u flashsale.SaleUpdate) (flashsale.Sale, error) {
	out, err := s.Store.Update(ctx, id, u)
	if err != nil {
		return out, err
	}
	return out, s.cache.Refresh(ctx)
}

// accessAdmin is the access store as the operator API sees it: an
// allowlist upload moves the sale's version, and the sale at its new
// version is in this gateway's cache before the answer goes out, so the
// operator's next join is checked against the new list (other gateways
// follow through the announcement, or their refresh within a second).
type accessAdmin struct {
	*access.Store
	cache *sales.Cache
}

func (a accessAdmin) PutAllowlistCSV(ctx context.Context, saleID, ifVersion int64, body []byte, appendTo bool, actor string) (int, error) {
	n, err := a.Store.PutAllowlistCSV(ctx, saleID, ifVersion, body, appendTo, actor)
	if err != nil {
		return n, err
	}
	return n, a.cache.Refresh(ctx)
}

// drawAdapter presents the waiting room's stored draw records as the
// gateway's Draws.
type drawAdapter struct{ room *waitroom.Room }

func (d drawAdapter) PublishedDraw(ctx context.Context, saleID, maxBody int64) (gateway.DrawRecord, error) {
	f, err := d.room.PublishedDraw(ctx, saleID, maxBody)
	if err != nil {
		return gateway.DrawRecord{}, err
	}
	return gateway.DrawRecord{Body: f.Body, Gzip: f.Gzip, ETag: f.ETag}, nil
}

// queueKeyTTL is the room's QueueKeyTTL for the configured one: 0 (keep
// the keys) is the room's negative.
func queueKeyTTL(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// pushAdapter is the gateway's Push: it checks a subscription and keeps
// it until the sale's queue keys expire (its end plus the queue keys' TTL).
type pushAdapter struct {
	store    *push.Store
	sender   *push.Sender
	insecure push.Hosts
	keyTTL   time.Duration // 0: the keys never expire
}

func (p pushAdapter) PublicKey() string { return p.sender.PublicKey() }

func (p pushAdapter) Subscribe(ctx context.Context, sale *flashsale.Sale, userID int64, body []byte) error {
	sub, err := push.Parse(body, p.insecure)
	if err != nil {
		return err
	}
	var expireAt time.Time
	if !sale.EndsAt.IsZero() && p.keyTTL > 0 {
		expireAt = sale.EndsAt.Add(p.keyTTL)
	}
	return p.store.Put(ctx, sale.ID, userID, sub, expireAt)
}

func (p pushAdapter) Unsubscribe(ctx context.Context, saleID, userID int64) error {
	return p.store.Delete(ctx, saleID, userID)
}
