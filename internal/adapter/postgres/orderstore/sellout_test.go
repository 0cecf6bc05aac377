package orderstore

import "testing"

// TestSellOutStep: the finest listed step that keeps the curve within
// 2,000 steps, then whole minutes.
func TestSellOutStep(t *testing.T) {
	for _, c := range []struct{ spanMs, want int64 }{
		{0, 100},
		{1_100, 100},          // a drop sold out in 1.1 s: 11 steps
		{199_999, 100},        // 1,999 steps
		{200_000, 250},        // 2,000 steps of 100 ms: one too many
		{3_600_000, 2_000},    // an hour
		{119_999_999, 60_000}, // 1,999 minutes
		{120_000_000, 120_000},
		{24 * 3_600_000, 60_000},
		{30 * 24 * 3_600_000, 1_320_000}, // 30 days in 1,964 steps of 22 minutes
	} {
		got := sellOutStep(c.spanMs)
		if got != c.want {
			t.Errorf("sellOutStep(%d) = %d, want %d", c.spanMs, got, c.want)
		}
		if c.spanMs/got >= 2000 {
			t.Errorf("sellOutStep(%d) = %d: %d steps", c.spanMs, got, c.spanMs/got)
		}
	}
}
