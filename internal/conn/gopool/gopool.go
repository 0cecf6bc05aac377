// Package gopool runs short functions on goroutines that outlive them. A
// function goes to an idle goroutine of the pool when one waits, else to
// a new one; after a function a goroutine waits up to the pool's idle
// time for the next, then ends. A connection's work started on a new
// goroutine each time (a head's routing, a handshake, a ping) grows a
// fresh 2 KiB stack through the same deep calls every time, and the
// runtime copies the stack at each doubling (runtime.copystack was a
// tenth of a gateway's CPU while shoppers arrived); a kept goroutine has
// grown already.
//
// The package knows nothing of the module (layout_test.go).
package gopool

import (
	"sync"
	"time"
)

// Pool is a set of goroutines that run the functions given to Go. Its
// owner calls Close, then Wait, once nothing calls Go any more.
type Pool struct {
	idle time.Duration
	work chan func()
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// New returns a pool whose goroutines wait idle for the next function
// before they end.
func New(idle time.Duration) *Pool {
	return &Pool{idle: idle, work: make(chan func()), stop: make(chan struct{})}
}

// Go runs f on an idle goroutine of the pool, or on a new one. It never
// waits for f. After Close it still runs f, on a goroutine that then
// ends.
func (p *Pool) Go(f func()) {
	select {
	case p.work <- f: // an idle goroutine took it
		return
	default:
	}
	p.wg.Add(1)
	go p.run(f)
}

// run runs f, then the functions idle goroutines are handed, until none
// comes within p.idle or the pool is closed.
func (p *Pool) run(f func()) {
	defer p.wg.Done()
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		f()
		t.Reset(p.idle)
		select {
		case f = <-p.work:
		case <-t.C:
			return
		case <-p.stop:
			return
		}
	}
}

// Close ends the idle goroutines now and the others after their
// function.
func (p *Pool) Close() { p.once.Do(func() { close(p.stop) }) }

// Wait waits until every goroutine of the pool has ended: after Close,
// once the functions running have returned. No Go may start while it
// waits.
func (p *Pool) Wait() { p.wg.Wait() }
