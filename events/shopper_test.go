package events

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// The turns a leader reports reach the shop's webhook as signed
// shopper.admitted events, once per place and kind, with event ids no
// order event has; a refused request is retried with the same id.
func TestShopperEventsReachTheWebhook(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	orders := appendEvents(t, pool, 1)
	var lastOrderEvent, refusedID int64
	if err := pool.QueryRow(context.Background(), `SELECT max(id) FROM order_events`).Scan(&lastOrderEvent); err != nil {
		t.Fatal(err)
	}
	rc, srv := newReceiver(t, func(id int64, _ int) int {
		if id > lastOrderEvent && refusedID == 0 {
			refusedID = id // under the receiver's lock
			return 503
		}
		return 0
	})
	reg := prometheus.NewRegistry()
	s := NewShoppers(ShopperConfig{}, pool, nil, reg)
	at := time.Date(2026, 12, 5, 7, 0, 0, 123456000, time.UTC)
	turns := func(ts ...flashsale.Turn) func(context.Context) ([]flashsale.Turn, error) {
		return func(context.Context) ([]flashsale.Turn, error) { return ts, nil }
	}
	s.Turns(7, flashsale.TurnAdmitted, at, turns(flashsale.Turn{UserID: 42, Place: 0}, flashsale.Turn{UserID: 43, Place: 1}))
	s.Turns(7, flashsale.TurnAdmitted, at, turns(flashsale.Turn{UserID: 42, Place: 0})) // told twice
	s.Turns(8, flashsale.TurnHeld, at.Add(time.Second), turns(flashsale.Turn{UserID: 42, Place: 5}))
	runUntilCleanup(t, "Shoppers.Run", s.Run)
	d, _ := newTestDeliverer(t, pool, srv.URL, WebhookConfig{})
	runDeliverer(t, d)

	want := []ShopperEvent{
		{SaleID: 7, UserID: 42, Place: 0, Kind: flashsale.TurnAdmitted, OccurredAt: at},
		{SaleID: 7, UserID: 43, Place: 1, Kind: flashsale.TurnAdmitted, OccurredAt: at},
		{SaleID: 8, UserID: 42, Place: 5, Kind: flashsale.TurnHeld, OccurredAt: at.Add(time.Second)},
	}
	var got []ShopperEvent
	ids := map[int64]bool{}
	testenv.EventuallyF(t, func() string { return "the shopper events delivered" }, 60*time.Second, func() bool {
		if countRows(t, pool, `SELECT count(*) FROM shopper_events WHERE webhook_done_at IS NULL`) != 0 || undelivered(t, pool) != 0 {
			return false
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		got = got[:0]
		clear(ids)
		for i, ev := range rc.accepted {
			ids[ev.EventID] = true
			if ev.Type != TypeShopperAdmitted {
				continue
			}
			var se ShopperEvent
			if err := json.Unmarshal(rc.bodies[i], &se); err != nil {
				t.Fatalf("body %s: %v", rc.bodies[i], err)
			}
			got = append(got, se)
		}
		return len(got) >= len(want)
	})
	slices.SortFunc(got, func(a, b ShopperEvent) int { return int(a.EventID - b.EventID) })
	if len(got) != len(want) {
		t.Fatalf("%d shopper events accepted, want %d: %+v", len(got), len(want), got)
	}
	for i, ev := range got {
		w := want[i]
		w.Version, w.EventID, w.Type = 1, ev.EventID, TypeShopperAdmitted
		if !ev.OccurredAt.Equal(w.OccurredAt) {
			t.Errorf("event %d occurredAt %v, want %v", i, ev.OccurredAt, w.OccurredAt)
		}
		ev.OccurredAt = w.OccurredAt
		if ev != w {
			t.Errorf("event %d = %+v, want %+v", i, ev, w)
		}
	}
	if n := len(orders) * len(lifecycle); len(ids) != n+len(want) {
		t.Errorf("%d distinct event ids over %d order and %d shopper events: ids shared", len(ids), n, len(want))
	}
	rc.mu.Lock()
	refused, tries := refusedID, rc.tries[refusedID]
	rc.mu.Unlock()
	if refused == 0 || tries != 2 {
		t.Errorf("event %d was tried %d times, want 2 (refused, then accepted)", refused, tries)
	}
	if got := metricValue(t, reg, "flashsale_events_shopper_written_total", "", ""); got != float64(len(want)) {
		t.Errorf("written = %v, want %d", got, len(want))
	}
}

// Turns never blocks: a report that finds the queue full is dropped and
// counted.
func TestShopperQueueFullDrops(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewShoppers(ShopperConfig{Queue: 1}, nil, nil, reg)
	none := func(context.Context) ([]flashsale.Turn, error) { return nil, nil }
	for range 3 {
		s.Turns(1, flashsale.TurnAdmitted, time.Now(), none)
	}
	if got := metricValue(t, reg, "flashsale_events_shopper_batches_dropped_total", "", ""); got != 2 {
		t.Errorf("dropped = %v, want 2", got)
	}
}
