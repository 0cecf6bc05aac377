package redisclock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/redisclock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestSkewedClockReadsRedisTime: a process whose own clock is 2 s off
// either way reads Redis's time once measured, and reports its clock.
func TestSkewedClockReadsRedisTime(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		skew time.Duration
		want string // in Check's error; "" for none
	}{
		{"fast", 2 * time.Second, "2s ahead of Redis TIME"},
		{"slow", -2 * time.Second, "2s behind Redis TIME"},
		{"within the bound", 100 * time.Millisecond, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redisclock.New(redisclock.Config{Skew: tc.skew}, rdb, nil)
			if err := c.Check(); err != redisclock.ErrNotMeasured {
				t.Fatalf("Check before a measurement: %v, want ErrNotMeasured", err)
			}
			if got := time.Until(c.Now()); (got - tc.skew).Abs() > 50*time.Millisecond {
				t.Fatalf("before a measurement Now is %s from time.Now, want the process's own clock (%s)", got, tc.skew)
			}
			if err := c.Measure(ctx); err != nil {
				t.Fatal(err)
			}
			srv, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Redis and this test share a machine clock: the fleet's time
			// is time.Now, whatever the skew.
			if d := time.Until(c.Now()); d.Abs() > 50*time.Millisecond {
				t.Errorf("Now is %s from the machine clock after a measurement, want about 0", d)
			}
			if d := c.Now().Sub(srv); d.Abs() > 50*time.Millisecond {
				t.Errorf("Now is %s from Redis TIME, want about 0", d)
			}
			if d := c.Offset() + tc.skew; d.Abs() > 50*time.Millisecond {
				t.Errorf("Offset %s, want about %s", c.Offset(), -tc.skew)
			}
			err = c.Check()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Check: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestFailedMeasurementKeepsTheOffset: a measurement that cannot reach
// Redis fails and leaves the last offset in place.
func TestFailedMeasurementKeepsTheOffset(t *testing.T) {
	rdb := testenv.Redis(t)
	c := redisclock.New(redisclock.Config{Skew: 3 * time.Second}, rdb, nil)
	if err := c.Measure(context.Background()); err != nil {
		t.Fatal(err)
	}
	off := c.Offset()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Measure(ctx); err == nil {
		t.Fatal("a measurement with a cancelled context succeeded")
	}
	if c.Offset() != off {
		t.Errorf("offset %s after a failed measurement, want the last one, %s", c.Offset(), off)
	}
}

// TestInjectedFleetClock: a clock given a fleet clock reads it (a jump
// of it at once, no measurement between), the gateway's correction of a
// request's arrival time follows it, and a measurement needs no Redis
// and still reports a skewed process clock.
func TestInjectedFleetClock(t *testing.T) {
	var ahead atomic.Int64
	fleet := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	c := redisclock.New(redisclock.Config{Fleet: fleet, Skew: time.Second}, nil, nil)
	if err := c.Measure(context.Background()); err != nil {
		t.Fatalf("Measure with an injected clock: %v", err)
	}
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), "1s ahead of") {
		t.Errorf("Check: %v, want the process's clock 1s ahead of the injected one", err)
	}
	ahead.Store(int64(time.Hour))
	if d := time.Until(c.Now()) - time.Hour; d.Abs() > 50*time.Millisecond {
		t.Errorf("Now is %s off the injected clock after it jumped an hour", d)
	}
	if d := time.Now().Add(c.Correction()).Sub(fleet()); d.Abs() > 50*time.Millisecond {
		t.Errorf("time.Now plus Correction is %s off the injected clock", d)
	}
}
