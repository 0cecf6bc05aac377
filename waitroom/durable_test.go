package waitroom

import (
	"context"
	"slices"
	"testing"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestPGDurable: checkpoints append tickets once each (a retry or a second
// leader overlapping the saved ones is harmless, a gap is refused), n is
// set once and the cursor never goes back.
func TestPGDurable(t *testing.T) {
	d := NewPGDurable(testenv.Postgres(t))
	ctx := context.Background()
	if _, found, err := d.Saved(ctx, 7); err != nil || found {
		t.Fatalf("Saved before any checkpoint: found %v, %v", found, err)
	}
	steps := []struct {
		first      int64
		users      []int64
		n, serving int64
		want       int64
	}{
		{0, []int64{11, 12, 13}, -1, 0, 3},
		{1, []int64{12, 13, 14, 15}, 5, 2, 5}, // overlaps: 14 and 15 appended
		{7, []int64{99}, 9, 1, 5},             // a gap: nothing appended; n stays, cursor stays
		{5, nil, 6, 4, 5},
	}
	for i, s := range steps {
		got, err := d.Save(ctx, 7, s.first, s.users, s.n, s.serving)
		if err != nil || got != s.want {
			t.Fatalf("step %d: Save = %d, %v; want %d", i, got, err, s.want)
		}
	}
	st, users, found, err := d.Load(ctx, 7)
	if err != nil || !found {
		t.Fatalf("Load: found %v, %v", found, err)
	}
	if want := (queueState{Seq: 5, N: 5, Serving: 4}); st != want || !slices.Equal(users, []int64{11, 12, 13, 14, 15}) {
		t.Fatalf("Load = %+v %v, want %+v [11 12 13 14 15]", st, users, want)
	}
}
