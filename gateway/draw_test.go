package gateway

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestDrawCache: concurrent requests for one sale build its record once; a
// failed build is not kept; the cache holds at most maxDrawEntries.
func TestDrawCache(t *testing.T) {
	var dc drawCache
	var builds atomic.Int32
	release := make(chan struct{})
	build := func() (StaticFile, error) {
		builds.Add(1)
		<-release
		return drawFile([]byte(`{"version":1}`))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if f, err := dc.get(1, build); err != nil || string(f.Body) != `{"version":1}` || f.ETag == "" || f.Gzip == nil {
				t.Errorf("get = %+v, %v", f, err)
			}
		})
	}
	close(release)
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Fatalf("%d builds for 8 concurrent requests, want 1", n)
	}

	fail := errors.New("redis down")
	if _, err := dc.get(2, func() (StaticFile, error) { return StaticFile{}, fail }); !errors.Is(err, fail) {
		t.Fatalf("failed build: %v", err)
	}
	if _, err := dc.get(2, func() (StaticFile, error) { return drawFile([]byte("{}")) }); err != nil {
		t.Fatalf("a failure was kept: %v", err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = dc.get(3, func() (StaticFile, error) { panic("bug") })
	}()
	if _, err := dc.get(3, func() (StaticFile, error) { return drawFile([]byte("{}")) }); err != nil {
		t.Fatalf("after a panicking build: %v", err)
	}
	for id := int64(10); id < 20; id++ {
		if _, err := dc.get(id, func() (StaticFile, error) { return drawFile([]byte("{}")) }); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(dc.m); n > maxDrawEntries {
		t.Fatalf("%d records kept, want at most %d", n, maxDrawEntries)
	}
}
