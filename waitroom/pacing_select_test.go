package waitroom

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestFrontFirst: the k smallest places come first, in order, whatever
// the input order, and the rest are all kept behind them.
func TestFrontFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 10, 257, 5000} {
		for _, k := range []int{0, 1, 2, n / 2, n - 1, n, n + 3} {
			places := rng.Perm(n)
			if n > 20 { // some equal places too
				for i := range n / 10 {
					places[i] = places[n-1-i]
				}
			}
			due := make([]dueStatus, n)
			for i, p := range places {
				due[i] = dueStatus{c: &conn{place: int64(p)}}
			}
			frontFirst(due, k)
			want := slices.Clone(places)
			slices.Sort(want)
			got := make([]int, n)
			for i, d := range due {
				got[i] = int(d.c.place)
			}
			m := min(max(k, 0), n)
			if !slices.Equal(got[:m], want[:m]) {
				t.Fatalf("n=%d k=%d: front %v, want %v", n, k, got[:m], want[:m])
			}
			rest := slices.Clone(got[m:])
			slices.Sort(rest)
			if !slices.Equal(rest, want[m:]) {
				t.Fatalf("n=%d k=%d: the rest is not what was left", n, k)
			}
		}
	}
}

func BenchmarkFrontFirst(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := make([]dueStatus, 16000)
	for i, p := range rng.Perm(len(base)) {
		base[i] = dueStatus{c: &conn{place: int64(p)}}
	}
	due := make([]dueStatus, len(base))
	for b.Loop() {
		copy(due, base)
		frontFirst(due, 250)
	}
}
