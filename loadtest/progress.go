package loadtest

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// progress prints a \r-updated line from the sum of the local recorder and
// the workers' latest counters.
type progress struct {
	w     io.Writer
	start time.Time
	local *recorder

	mu      sync.Mutex
	workers map[int]Counters
}

func newProgress(w io.Writer, start time.Time, local *recorder) *progress {
	return &progress{w: w, start: start, local: local, workers: map[int]Counters{}}
}

func (p *progress) setWorker(i int, c Counters) {
	p.mu.Lock()
	p.workers[i] = c
	p.mu.Unlock()
}

func (p *progress) total() Counters {
	c := p.local.live.snapshot()
	p.mu.Lock()
	for _, w := range p.workers {
		c.add(w)
	}
	p.mu.Unlock()
	return c
}

// run prints every 500 ms until ctx ends, then a final line and a newline.
func (p *progress) run(ctx context.Context) {
	if p.w == nil {
		return
	}
	const every = 500 * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	prev, prevAt := p.total(), time.Now()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(p.w, "\r%s\n", p.line(p.total(), prev, time.Since(prevAt)))
			return
		case <-t.C:
			c, now := p.total(), time.Now()
			fmt.Fprintf(p.w, "\r%s", p.line(c, prev, now.Sub(prevAt)))
			prev, prevAt = c, now
		}
	}
}

func (p *progress) line(c, prev Counters, dt time.Duration) string {
	sec := max(dt.Seconds(), 1e-3)
	rate := func(a, b int64) int64 { return int64(float64(a-b) / sec) }
	return fmt.Sprintf("[%6.1fs] joined %d (%d/s) admitted %d (%d/s) reserved %d (%d/s) sold-out %d paid %d hostile %d errors %d (%d/s) reconnects %d req/s %d   ",
		time.Since(p.start).Seconds(),
		c.Joined, rate(c.Joined, prev.Joined), c.Admitted, rate(c.Admitted, prev.Admitted),
		c.Reserved, rate(c.Reserved, prev.Reserved), c.SoldOut, c.Paid, c.Hostile,
		c.Errors, rate(c.Errors, prev.Errors), c.Reconnects, rate(c.Requests, prev.Requests))
}
