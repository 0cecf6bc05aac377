package gateway

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

func testDraw(n int) (StaticFile, error) {
	return drawFile(DrawRecord{Body: bytes.Repeat([]byte("b"), n), Gzip: bytes.Repeat([]byte("g"), n), ETag: `"t"`}), nil
}

// TestDrawCache: concurrent requests for one sale load its record once; a
// failed load is not kept, NOT_DRAWN only for notDrawnFor; the cache holds
// at most max bytes and evicts the least recently used record first.
func TestDrawCache(t *testing.T) {
	dc := drawCache{max: 1000}
	now := time.Unix(1_900_000_000, 0)
	var loads atomic.Int32
	release := make(chan struct{})
	load := func() (StaticFile, error) {
		loads.Add(1)
		<-release
		return drawFile(DrawRecord{Body: []byte(`{"version":2}`), Gzip: []byte("gz"), ETag: `"abc"`}), nil
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			f, err := dc.get(1, now, load)
			if err != nil || string(f.Body) != `{"version":2}` || f.ETag != `"abc"` || f.GzipETag != `"abc-gz"` || f.Gzip == nil {
				t.Errorf("get = %+v, %v", f, err)
			}
		})
	}
	close(release)
	wg.Wait()
	if n := loads.Load(); n != 1 {
		t.Fatalf("%d loads for 8 concurrent requests, want 1", n)
	}

	fail := errors.New("postgres down")
	if _, err := dc.get(2, now, func() (StaticFile, error) { return StaticFile{}, fail }); !errors.Is(err, fail) {
		t.Fatalf("failed load: %v", err)
	}
	if _, err := dc.get(2, now, func() (StaticFile, error) { return testDraw(1) }); err != nil {
		t.Fatalf("a failure was kept: %v", err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = dc.get(3, now, func() (StaticFile, error) { panic("bug") })
	}()
	if _, err := dc.get(3, now, func() (StaticFile, error) { return testDraw(1) }); err != nil {
		t.Fatalf("after a panicking load: %v", err)
	}

	// NOT_DRAWN is kept for notDrawnFor, then asked again.
	notDrawn := func() (StaticFile, error) { loads.Add(1); return StaticFile{}, errNotDrawn }
	loads.Store(0)
	for range 3 {
		if _, err := dc.get(4, now, notDrawn); flashsale.ErrorCode(err) != flashsale.CodeNotDrawn {
			t.Fatalf("not drawn: %v", err)
		}
	}
	if _, err := dc.get(4, now.Add(notDrawnFor-time.Millisecond), notDrawn); flashsale.ErrorCode(err) != flashsale.CodeNotDrawn || loads.Load() != 1 {
		t.Fatalf("within notDrawnFor: %v, %d loads, want NOT_DRAWN from 1 load", err, loads.Load())
	}
	if _, err := dc.get(4, now.Add(notDrawnFor), func() (StaticFile, error) { return testDraw(1) }); err != nil {
		t.Fatalf("after notDrawnFor: %v", err)
	}

	// Bounded by bytes, least recently used out first.
	dc = drawCache{max: 1000}
	for id := int64(10); id < 14; id++ { // 4 × 200 bytes
		if _, err := dc.get(id, now, func() (StaticFile, error) { return testDraw(100) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dc.get(10, now, func() (StaticFile, error) { t.Fatal("a kept record loaded again"); return StaticFile{}, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.get(14, now, func() (StaticFile, error) { return testDraw(250) }); err != nil { // 500 bytes: 11 and 12 go
		t.Fatal(err)
	}
	if dc.used > dc.max {
		t.Fatalf("%d bytes kept, max %d", dc.used, dc.max)
	}
	for id, want := range map[int64]bool{10: true, 11: false, 12: false, 13: true, 14: true} {
		if _, got := dc.m[id]; got != want {
			t.Errorf("sale %d kept %v, want %v", id, got, want)
		}
	}
	// A record larger than the cache is served, not kept.
	if f, err := dc.get(15, now, func() (StaticFile, error) { return testDraw(600) }); err != nil || len(f.Body) != 600 {
		t.Fatalf("large record: %d bytes, %v", len(f.Body), err)
	}
	if _, kept := dc.m[15]; kept || dc.used > dc.max {
		t.Fatalf("a record above max kept (used %d)", dc.used)
	}
}
