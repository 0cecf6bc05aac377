// Package redisclock is the fleet's one clock for a sale's timeline: the
// pre-queue's close, the draw, the opening, admission not-before, "sale
// open" on a purchase and every serverTimeMs read Redis's TIME, through an
// offset each process measures at start and refreshes. Two gateways whose
// own clocks disagree by seconds then close the pre-queue, open the sale
// and count down to the same instant.
//
// The offset is the one of the fastest of a few TIME round trips, the
// server's time taken as read at the round trip's middle: its error is at
// most half that round trip. A measurement that fails keeps the last
// offset (a clock drifts by microseconds a minute; Redis down is the
// dependency probe's to report).
package redisclock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config tunes a Clock; the zero value is usable.
type Config struct {
	// Skew makes the process's own clock run off by this much
	// (FLASHSALE_CLOCK_SKEW): drills and tests inject a wrong clock with
	// it, since faketime does not reach Go binaries.
	Skew time.Duration
	// Interval is the time between measurements [10s].
	Interval time.Duration
	// Samples is the TIME round trips of one measurement [5].
	Samples int
	// MaxOffset is the offset past which the process reports its clock
	// (Check, /readyz detail) [500ms].
	MaxOffset time.Duration
	// MaxRTT is the slowest round trip a measurement may rest on: a slower
	// one is too uncertain and keeps the last offset [100ms].
	MaxRTT time.Duration
	// Fleet, when set, is the fleet clock in place of Redis TIME: it is
	// read at every call and a measurement takes the offset from it
	// without a round trip. In-process tests inject one to move a sale's
	// timeline without waiting; no setting sets it.
	Fleet func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 10 * time.Second
	}
	if c.Samples <= 0 {
		c.Samples = 5
	}
	if c.MaxOffset <= 0 {
		c.MaxOffset = 500 * time.Millisecond
	}
	if c.MaxRTT <= 0 {
		c.MaxRTT = 100 * time.Millisecond
	}
	return c
}

// Clock is the fleet clock of one process. Its methods are safe for
// concurrent use.
type Clock struct {
	cfg Config
	rdb redis.UniversalClient
	log *slog.Logger

	offset   atomic.Int64 // fleet clock minus the process's own clock (skew included), ns
	measured atomic.Bool
}

// New builds a clock over rdb; it reads the process's own clock until its
// first measurement.
func New(cfg Config, rdb redis.UniversalClient, logger *slog.Logger) *Clock {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Clock{cfg: cfg.withDefaults(), rdb: rdb, log: logger.With("component", "clock")}
}

// local is the process's own clock, as skewed.
func (c *Clock) local() time.Time { return time.Now().Add(c.cfg.Skew) }

// Now is the fleet's time.
func (c *Clock) Now() time.Time {
	if c.cfg.Fleet != nil {
		return c.cfg.Fleet()
	}
	return time.Now().Add(c.Correction())
}

// Correction is what turns a reading of time.Now into the fleet's time
// (the skew and the measured offset): the gateway adds it to a request's
// arrival time.
func (c *Clock) Correction() time.Duration {
	if c.cfg.Fleet != nil {
		return time.Until(c.cfg.Fleet())
	}
	return c.cfg.Skew + time.Duration(c.offset.Load())
}

// Offset is the fleet clock minus the process's own clock, as last
// measured (0 before the first measurement).
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Measure takes Samples TIME round trips and keeps the offset of the
// fastest. It fails, keeping the last offset, when no round trip succeeds
// or the fastest is slower than MaxRTT.
func (c *Clock) Measure(ctx context.Context) error {
	if c.cfg.Fleet != nil {
		c.offset.Store(int64(c.cfg.Fleet().Sub(c.local())))
		c.measured.Store(true)
		return nil
	}
	tc, err := c.timeClient(ctx)
	if err != nil {
		return fmt.Errorf("redisclock.Measure: %w", err)
	}
	best, bestRTT := time.Duration(0), time.Duration(-1)
	var lastErr error
	for range c.cfg.Samples {
		t0 := c.local()
		srv, err := tc.Time(ctx).Result()
		t1 := c.local()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rtt := t1.Sub(t0)
		if bestRTT < 0 || rtt < bestRTT {
			best, bestRTT = srv.Sub(t0.Add(rtt/2)), rtt
		}
	}
	switch {
	case bestRTT < 0:
		return fmt.Errorf("redisclock.Measure: TIME: %w", lastErr)
	case bestRTT > c.cfg.MaxRTT:
		return fmt.Errorf("redisclock.Measure: fastest TIME round trip %s, above %s", bestRTT, c.cfg.MaxRTT)
	}
	c.offset.Store(int64(best))
	c.measured.Store(true)
	return nil
}

// timeClient is the one server whose clock the fleet reads: on a cluster,
// the master of a fixed slot, so that every process reads the same
// server's clock.
func (c *Clock) timeClient(ctx context.Context) (redis.Cmdable, error) {
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, "{flashsale-clock}")
	}
	return c.rdb, nil
}

// Run measures every Interval until ctx ends; a failed measurement is
// logged and the last offset kept.
func (c *Clock) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		mctx, cancel := context.WithTimeout(ctx, c.cfg.Interval)
		err := c.Measure(mctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			c.log.Warn("clock not measured; keeping the last offset", "err", err, "offset", c.Offset())
		}
	}
}

// ErrNotMeasured is Check's answer before the first measurement.
var ErrNotMeasured = errors.New("clock: offset to Redis TIME not measured yet; sale times use this process's own clock")

// Check reports a clock that was never measured, or whose offset to the
// fleet clock passes MaxOffset. The process keeps the fleet's time either
// way (the offset corrects it); the report says its own clock is wrong.
func (c *Clock) Check() error {
	if !c.measured.Load() {
		return ErrNotMeasured
	}
	off := c.Offset()
	if off <= c.cfg.MaxOffset && off >= -c.cfg.MaxOffset {
		return nil
	}
	way := "behind"
	if off < 0 {
		way, off = "ahead of", -off
	}
	return fmt.Errorf("clock: this process's clock is %s %s Redis TIME (bound %s); sale times follow Redis's", off.Round(time.Millisecond), way, c.cfg.MaxOffset)
}
