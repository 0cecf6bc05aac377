package gateway

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

var errNotDrawn = flashsale.Errorf(flashsale.CodeNotDrawn, "the pre-queue has not been drawn yet: the draw happens when the pre-queue closes")

// drawCacheControl lets browsers and CDNs keep a record for good: it never
// changes after the draw.
const drawCacheControl = "public, max-age=31536000, immutable"

// maxDrawEntries bounds the records a gateway keeps; a record evicted is
// built again on its next request.
const maxDrawEntries = 4

// saleDraw is GET /api/flash-sales/sales/{saleId}/draw: the public draw
// record (CONTRACT section 4, docs/DRAW.md).
func (s *Server) saleDraw(c *fiber.Ctx) error {
	sale, now, ok, err := s.pathSale(c)
	if !ok {
		return err
	}
	if s.d.Draws == nil {
		return errNoSale
	}
	if !s.seedPublic(sale, now) {
		return errNotDrawn
	}
	f, err := s.draws.get(sale.ID, func() (StaticFile, error) {
		ctx, cancel := s.reqCtx()
		defer cancel()
		body, err := s.d.Draws.DrawRecord(ctx, sale)
		if err != nil {
			return StaticFile{}, err
		}
		return drawFile(body)
	})
	if err != nil {
		return err
	}
	return sendFile(c, f)
}

// drawFile is a record's body with its gzip form and tags.
func drawFile(body []byte) (StaticFile, error) {
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // a valid level: no error
	if _, err := zw.Write(body); err != nil {
		return StaticFile{}, fmt.Errorf("gateway.drawFile: %w", err)
	}
	if err := zw.Close(); err != nil {
		return StaticFile{}, fmt.Errorf("gateway.drawFile: %w", err)
	}
	sum := sha256.Sum256(body)
	tag := hex.EncodeToString(sum[:16])
	return StaticFile{
		Body: body, Gzip: gz.Bytes(),
		ContentType:  fiber.MIMEApplicationJSONCharsetUTF8,
		ETag:         `"` + tag + `"`,
		GzipETag:     `"` + tag + `-gz"`,
		CacheControl: drawCacheControl,
	}, nil
}

// drawCache keeps built records per sale. One request builds a record
// while the others for the same sale wait for it; a failure is not kept.
type drawCache struct {
	mu sync.Mutex
	m  map[int64]*drawEntry
}

type drawEntry struct {
	done chan struct{} // closed once f and err are set
	f    StaticFile
	err  error
}

func (dc *drawCache) get(saleID int64, build func() (StaticFile, error)) (StaticFile, error) {
	dc.mu.Lock()
	if e, ok := dc.m[saleID]; ok {
		dc.mu.Unlock()
		<-e.done
		return e.f, e.err
	}
	if dc.m == nil {
		dc.m = make(map[int64]*drawEntry)
	}
	if len(dc.m) >= maxDrawEntries {
		for id, e := range dc.m {
			select {
			case <-e.done:
				delete(dc.m, id)
			default:
			}
			if len(dc.m) < maxDrawEntries {
				break
			}
		}
	}
	e := &drawEntry{done: make(chan struct{})}
	dc.m[saleID] = e
	dc.mu.Unlock()

	built := false
	defer func() {
		if !built { // build panicked: the waiters must not wait forever
			e.err = errors.New("gateway: building the draw record failed")
		}
		if e.err != nil {
			dc.mu.Lock()
			delete(dc.m, saleID)
			dc.mu.Unlock()
		}
		close(e.done)
	}()
	e.f, e.err = build()
	built = true
	return e.f, e.err
}
