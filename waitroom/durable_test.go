package waitroom

import (
	"context"
	"slices"
	"testing"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestPGDurable: checkpoints append tickets once each (a retry or a second
// leader overlapping the saved ones is harmless, a gap is refused), n and
// the draw's tiered flag are set once, tiers come back with their tickets
// and the cursor never goes back.
func TestPGDurable(t *testing.T) {
	d := NewPGDurable(testenv.Postgres(t))
	ctx := context.Background()
	if _, found, err := d.Saved(ctx, 7); err != nil || found {
		t.Fatalf("Saved before any checkpoint: found %v, %v", found, err)
	}
	steps := []struct {
		first      int64
		users      []int64
		tiers      string
		n, serving int64
		tiered     bool
		want       int64
	}{
		{0, []int64{11, 12, 13}, "", -1, 0, true, 3},            // before the draw: tiered is not set
		{1, []int64{12, 13, 14, 15}, "\x000319", 5, 2, true, 5}, // overlaps: 14 and 15 appended, with their tiers
		{7, []int64{99}, "9", 9, 1, false, 5},                   // a gap: nothing appended; n and tiered stay, cursor stays
		{5, nil, "", 6, 4, false, 5},
		{5, []int64{16, 17}, "0", 6, 4, false, 7}, // no tier: a NULL row
	}
	for i, s := range steps {
		got, err := d.Save(ctx, 7, s.first, s.users, []byte(s.tiers), queueState{N: s.n, Serving: s.serving, Tiered: s.tiered})
		if err != nil || got != s.want {
			t.Fatalf("step %d: Save = %d, %v; want %d", i, got, err, s.want)
		}
	}
	st, users, tiers, found, err := d.Load(ctx, 7)
	if err != nil || !found {
		t.Fatalf("Load: found %v, %v", found, err)
	}
	if want := (queueState{Seq: 7, N: 5, Serving: 4, Tiered: true}); st != want || !slices.Equal(users, []int64{11, 12, 13, 14, 15, 16, 17}) {
		t.Fatalf("Load = %+v %v, want %+v [11 12 13 14 15 16 17]", st, users, want)
	}
	if string(tiers) != "0003100" {
		t.Fatalf("Load's tiers = %q, want %q (tickets 3 and 4 of tiers 3 and 1)", tiers, "0003100")
	}

	// A queue whose tickets have no tier loads no tiers.
	if _, err := d.Save(ctx, 8, 0, []int64{21, 22}, nil, queueState{N: 2}); err != nil {
		t.Fatal(err)
	}
	if st, _, tiers, _, err := d.Load(ctx, 8); err != nil || tiers != nil || st.Tiered {
		t.Fatalf("Load of an untiered queue: %+v tiers %q, %v", st, tiers, err)
	}
}
