package waitroom

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

// recordingNotifier resolves every batch at once and keeps the users.
type recordingNotifier struct {
	mu    sync.Mutex
	users []int64
	err   error
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
	gws := []*gateway{e.newGateway(Config{Notify: notes[0]}, nil), e.newGateway(Config{Notify: notes[1]}, nil)}
	gws[0].joinUsers(t, sale.ID, 40) // the pre-queue
	// Both gateways tick before the opening, so the leader's first look
	// is behind it.
	gws[0].waitTicks(t, 2)
	gws[1].waitTicks(t, 2)
	e.clock.Advance(time.Minute)
	for u := int64(41); u <= 60; u++ { // joined after the opening
		if _, err := gws[int(u)%2].room.Join(context.Background(), flashsale.Principal{UserID: u}, sale.ID, testIP, nil); err != nil {
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
}
