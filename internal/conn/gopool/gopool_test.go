package gopool

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReusesIdleGoroutines: functions given one after another run on the
// goroutine the first one started, while it waits; every function runs.
func TestReusesIdleGoroutines(t *testing.T) {
	p := New(time.Minute)
	var ran atomic.Int64
	ids := make(map[uint64]bool)
	var mu sync.Mutex
	for range 50 {
		done := make(chan struct{})
		p.Go(func() {
			mu.Lock()
			ids[goid()] = true
			mu.Unlock()
			ran.Add(1)
			close(done)
		})
		<-done
		waitIdle(t, p, 1)
	}
	p.Close()
	p.Wait()
	if ran.Load() != 50 {
		t.Fatalf("%d functions ran, want 50", ran.Load())
	}
	if len(ids) != 1 {
		t.Fatalf("50 functions one after another ran on %d goroutines, want 1", len(ids))
	}
}

// TestBusyStartsNew: a function given while every goroutine is busy gets a
// new one, and Go does not wait for it.
func TestBusyStartsNew(t *testing.T) {
	p := New(time.Minute)
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	for range 3 {
		p.Go(func() {
			started <- struct{}{}
			<-release
		})
	}
	for range 3 { // three at once: three goroutines
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("a function given while the others ran did not start")
		}
	}
	close(release)
	p.Close()
	p.Wait()
}

// TestIdleGoroutineEnds: a goroutine with nothing to run ends after the
// idle time, and Wait returns without Close.
func TestIdleGoroutineEnds(t *testing.T) {
	p := New(10 * time.Millisecond)
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	waited := make(chan struct{})
	go func() { p.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("an idle goroutine outlived its idle time")
	}
}

// TestCloseEndsIdleAndRunsLater: Close ends the idle goroutines at once
// (Wait returns although the idle time is an hour), and a function given
// after Close still runs.
func TestCloseEndsIdleAndRunsLater(t *testing.T) {
	p := New(time.Hour)
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	waitIdle(t, p, 1)
	p.Close()
	p.Wait()
	after := make(chan struct{})
	p.Go(func() { close(after) })
	<-after
	p.Wait()
}

// waitIdle waits until n goroutines of p wait for work (blocked receiving
// on p.work), so that the next Go can be handed to one of them.
func waitIdle(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for idleCount(p) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d goroutines of the pool wait for work", n)
		}
		runtime.Gosched()
	}
}

// idleCount counts the goroutines parked in run's select: a send on
// p.work now finds one of them.
func idleCount(*Pool) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, " [select") && strings.Contains(g, "gopool.(*Pool).run(") {
			n++
		}
	}
	return n
}

// goid is the calling goroutine's id, from its stack's first line.
func goid() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	id, _ := strconv.ParseUint(f[1], 10, 64)
	return id
}
