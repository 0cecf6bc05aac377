package gateway

import (
	"container/list"
	"errors"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

var errNotDrawn = flashsale.Errorf(flashsale.CodeNotDrawn, "the pre-queue has not been drawn yet: the draw happens when the pre-queue closes")

// drawCacheControl lets browsers and CDNs keep a record for good: it never
// changes after the draw.
const drawCacheControl = "public, max-age=31536000, immutable"

// notDrawnFor is how long a gateway answers NOT_DRAWN for a sale from
// memory before it asks the store again: between the pre-queue's close
// and the leader's store of the record, a crowd asking costs one read a
// second.
const notDrawnFor = time.Second

// saleDraw is GET /api/flash-sales/sales/{saleId}/draw: the public draw
// record (CONTRACT section 4, docs/DRAW.md). The record is built once, by
// the sale's leader at the draw, and stored; this serves the stored bytes
// from memory (a byte-bounded LRU) or, on a miss, from the store. No
// request builds a record.
func (s *Server) saleDraw(c *fiber.Ctx) error {
	now := s.reqNow(c)
	if _, ok := s.checkAddr(c, ClassDraw, now); !ok {
		return nil
	}
	saleID, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	sale, ok := s.d.Sales.Sale(saleID)
	if !ok || s.d.Draws == nil {
		return errNoSale
	}
	if !s.seedPublic(sale, now) {
		return errNotDrawn
	}
	f, err := s.draws.get(sale.ID, now, func() (StaticFile, error) {
		ctx, cancel := s.reqCtx()
		defer cancel()
		s.metrics.drawLoads.Inc()
		rec, err := s.d.Draws.PublishedDraw(ctx, sale.ID, s.cfg.DrawIdentityMax)
		if err != nil {
			return StaticFile{}, err
		}
		return drawFile(rec), nil
	})
	if err != nil {
		return err
	}
	if f.Body == nil {
		// Above DrawIdentityMax: gzip only, to every client (docs/DRAW.md).
		c.Set(fiber.HeaderCacheControl, f.CacheControl)
		c.Set(fiber.HeaderETag, f.GzipETag)
		if etagMatch(c.Get(fiber.HeaderIfNoneMatch), f.GzipETag) {
			c.Status(fiber.StatusNotModified)
			return nil
		}
		c.Set(fiber.HeaderContentType, f.ContentType)
		c.Set(fiber.HeaderContentEncoding, "gzip")
		return c.Send(f.Gzip)
	}
	return sendFile(c, f)
}

// drawFile is a stored record as the gateway sends it.
func drawFile(rec DrawRecord) StaticFile {
	gzTag := rec.ETag
	if n := len(gzTag); n >= 2 && gzTag[n-1] == '"' {
		gzTag = gzTag[:n-1] + `-gz"`
	}
	return StaticFile{
		Body: rec.Body, Gzip: rec.Gzip,
		ContentType:  fiber.MIMEApplicationJSONCharsetUTF8,
		ETag:         rec.ETag,
		GzipETag:     gzTag,
		CacheControl: drawCacheControl,
	}
}

// drawCache keeps loaded records, least recently used evicted first, in
// at most max bytes (bodies and gzip forms). One request loads a record
// while the others for the same sale wait for it; NOT_DRAWN is kept for
// notDrawnFor, any other failure not at all.
type drawCache struct {
	mu   sync.Mutex
	max  int64
	used int64
	m    map[int64]*drawEntry
	lru  list.List // of *drawEntry, most recent first: the loaded ones
}

type drawEntry struct {
	id    int64
	done  chan struct{} // closed once f and err are set
	f     StaticFile
	err   error
	size  int64
	el    *list.Element // in lru; nil while loading or when not kept
	until time.Time     // of a NOT_DRAWN answer
}

func (dc *drawCache) get(saleID int64, now time.Time, load func() (StaticFile, error)) (StaticFile, error) {
	dc.mu.Lock()
	if e, ok := dc.m[saleID]; ok {
		stale := false
		select {
		case <-e.done:
			stale = e.err != nil && !now.Before(e.until)
		default:
		}
		if !stale {
			if e.el != nil {
				dc.lru.MoveToFront(e.el)
			}
			dc.mu.Unlock()
			<-e.done
			return e.f, e.err
		}
		delete(dc.m, saleID)
	}
	if dc.m == nil {
		dc.m = make(map[int64]*drawEntry)
	}
	e := &drawEntry{id: saleID, done: make(chan struct{})}
	dc.m[saleID] = e
	dc.mu.Unlock()

	loaded := false
	defer func() {
		if !loaded { // load panicked: the waiters must not wait forever
			e.err = errors.New("gateway: loading the draw record failed")
		}
		dc.mu.Lock()
		dc.keep(e, now)
		dc.mu.Unlock()
		close(e.done)
	}()
	e.f, e.err = load()
	loaded = true
	return e.f, e.err
}

// keep files a loaded entry: a record in the LRU (evicting the least
// recently used past max), NOT_DRAWN for a while, any other error not.
func (dc *drawCache) keep(e *drawEntry, now time.Time) {
	switch {
	case e.err != nil && flashsale.ErrorCode(e.err) == flashsale.CodeNotDrawn:
		e.until = now.Add(notDrawnFor)
		return
	case e.err != nil:
		delete(dc.m, e.id)
		return
	}
	e.size = int64(len(e.f.Body) + len(e.f.Gzip))
	if e.size > dc.max {
		delete(dc.m, e.id) // served to its waiters, not kept
		return
	}
	e.el = dc.lru.PushFront(e)
	dc.used += e.size
	for dc.used > dc.max {
		old := dc.lru.Remove(dc.lru.Back()).(*drawEntry)
		old.el = nil
		dc.used -= old.size
		delete(dc.m, old.id)
	}
}
