package waitroom

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

// recordingNotifier resolves every batch at once and keeps the users; as
// a TurnLog it keeps the turns too.
type recordingNotifier struct {
	mu    sync.Mutex
	users []int64
	turns []flashsale.Turn
	kinds map[flashsale.TurnKind]int
	err   error
}

func (n *recordingNotifier) Turns(_ int64, kind flashsale.TurnKind, _ time.Time, turns func(context.Context) ([]flashsale.Turn, error)) {
	got, err := turns(context.Background())
	n.mu.Lock()
	defer n.mu.Unlock()
	n.turns = append(n.turns, got...)
	if n.kinds == nil {
		n.kinds = map[flashsale.TurnKind]int{}
	}
	n.kinds[kind] += len(got)
	if err != nil {
		n.err = err
	}
}

func (n *recordingNotifier) Admitted(_ int64, users func(context.Context) ([]int64, error)) {
	got, err := users(context.Background())
	n.mu.Lock()
	defer n.mu.Unlock()
	n.users = append(n.users, got...)
	if err != nil {
		n.err = err
	}
}

func (n *recordingNotifier) seen() ([]int64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.users), n.err
}

// TestNotifyRaceOrderOncePerPlace: two gateways tick the same race sale;
// every place the cursor passes is reported once, by the leader, whether
// drawn (pre-queue) or joined after the opening.
func TestNotifyRaceOrderOncePerPlace(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 41, e.clock.Now().Add(time.Minute), 50, 1000))
	notes := []*recordingNotifier{{}, {}}
	gws := []*gateway{e.newGateway(Config{Notify: notes[0], Turns: notes[0]}, nil), e.newGateway(Config{Notify: notes[1], Turns: notes[1]}, nil)}
	gws[0].joinUsers(t, sale.ID, 40) // the pre-queue
	// Both gateways tick before the opening, so the leader's first look
	// is behind it.
	gws[0].waitTicks(t, 2)
	gws[1].waitTicks(t, 2)
	e.clock.Advance(time.Minute)
	for u := int64(41); u <= 60; u++ { // joined after the opening
		if _, err := gws[int(u)%2].room.Join(context.Background(), flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "everyone admitted", 20*time.Second, func() bool {
		e.clock.Advance(20 * time.Millisecond)
		return gws[0].admitted(t, sale.ID) >= 60
	})
	var all []int64
	eventually(t, "every place reported", 20*time.Second, func() bool {
		all = all[:0]
		for _, n := range notes {
			got, err := n.seen()
			if err != nil {
				t.Fatalf("resolving a batch: %v", err)
			}
			all = append(all, got...)
		}
		return len(all) >= 60
	})
	slices.Sort(all)
	for i, u := range all {
		if u != int64(i+1) {
			t.Fatalf("reported users %v, want 1…60 once each", all)
		}
	}
	if len(all) != 60 {
		t.Fatalf("%d reports, want 60", len(all))
	}
	// The turn log got the same turns, each place once, with its user (it
	// is told right after the notifier).
	var turns []flashsale.Turn
	eventually(t, "every turn logged", 20*time.Second, func() bool {
		turns = turns[:0]
		for _, n := range notes {
			n.mu.Lock()
			turns = append(turns, n.turns...)
			if n.kinds[flashsale.TurnHeld] != 0 {
				t.Errorf("race order reported %d held turns", n.kinds[flashsale.TurnHeld])
			}
			n.mu.Unlock()
		}
		return len(turns) >= 60
	})
	slices.SortFunc(turns, func(a, b flashsale.Turn) int { return int(a.Place - b.Place) })
	users := map[int64]bool{}
	for i, tr := range turns {
		if tr.Place != int64(i) || users[tr.UserID] {
			t.Fatalf("turns %v, want places 0…59 once each, one user each", turns)
		}
		users[tr.UserID] = true
		if tr.Place >= 40 && tr.UserID != tr.Place+1 {
			t.Errorf("place %d: user %d, want %d (joined after the opening, in order)", tr.Place, tr.UserID, tr.Place+1)
		}
	}
	if len(turns) != 60 {
		t.Errorf("%d turns, want 60", len(turns))
	}
}

// TestTellReadsTurnsOnce: with both a push notifier and a webhook turn
// log, one report reads the turns once; a failed read is not kept, so the
// other reader reads again and gets them.
func TestTellReadsTurnsOnce(t *testing.T) {
	want := []flashsale.Turn{{UserID: 7, Place: 3}, {UserID: 9, Place: 4}}
	for _, failFirst := range []bool{false, true} {
		note := &recordingNotifier{}
		r := &Room{cfg: Config{Notify: note, Turns: note, Now: time.Now}}
		reads := 0
		r.tell(1, flashsale.TurnAdmitted, func(context.Context) ([]flashsale.Turn, error) {
			reads++
			if failFirst && reads == 1 {
				return nil, context.DeadlineExceeded
			}
			return want, nil
		})
		wantReads := 1
		if failFirst {
			wantReads = 2
		}
		if reads != wantReads {
			t.Errorf("failFirst %v: %d reads of the turns, want %d", failFirst, reads, wantReads)
		}
		users, _ := note.seen()
		note.mu.Lock()
		turns := slices.Clone(note.turns)
		note.mu.Unlock()
		// The notifier reads first: when its read fails, the log's read
		// still gets every turn.
		if !slices.Equal(turns, want) {
			t.Errorf("failFirst %v: the turn log got %v, want %v", failFirst, turns, want)
		}
		if !failFirst && !slices.Equal(users, []int64{7, 9}) {
			t.Errorf("the notifier got users %v, want [7 9]", users)
		}
	}
}
