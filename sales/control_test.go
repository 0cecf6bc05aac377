package sales

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func auditCount(t *testing.T, s *Store, action string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE action = $1`, action).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every control bumps the version once, writes its audit row and is
// harmless when it changes nothing; a stale version changes nothing.
func TestActVersionsAndAudit(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	now := time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), func() time.Time { return now })
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Drop", StartsAt: now.Add(-time.Hour), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1999, Name: "Red sneaker", Currency: "EUR", ImageURL: "/assets/x.svg"}}})
	if err != nil {
		t.Fatal(err)
	}
	if sale.Version != 1 {
		t.Fatalf("version at creation %d, want 1", sale.Version)
	}
	got, err := s.Get(ctx, sale.ID)
	if err != nil || got.Items[0].Name != "Red sneaker" || got.Items[0].Currency != "EUR" || got.Items[0].ImageURL != "/assets/x.svg" {
		t.Fatalf("item details %+v, %v", got.Items, err)
	}
	act := func(a flashsale.SaleAction) (flashsale.Sale, error) {
		a.Actor = "9"
		return s.Act(ctx, sale.ID, a)
	}
	steps := []struct {
		a           flashsale.SaleAction
		wantVersion int64
	}{
		{flashsale.SaleAction{Kind: flashsale.ActionPause, IfVersion: 1}, 2},
		{flashsale.SaleAction{Kind: flashsale.ActionPause}, 2}, // already paused
		{flashsale.SaleAction{Kind: flashsale.ActionResume, IfVersion: 2}, 3},
		{flashsale.SaleAction{Kind: flashsale.ActionResume}, 3},
		{flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: "Back at 7"}, 4},
		{flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: ""}, 5},
		{flashsale.SaleAction{Kind: flashsale.ActionMessage, Text: ""}, 5}, // nothing to clear
		{flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: 5}, 6},
		{flashsale.SaleAction{Kind: flashsale.ActionEnd}, 7},
		{flashsale.SaleAction{Kind: flashsale.ActionEnd}, 7}, // already ended
	}
	for i, st := range steps {
		out, err := act(st.a)
		if err != nil || out.Version != st.wantVersion {
			t.Fatalf("step %d %s: version %d, %v; want %d", i, st.a.Kind, out.Version, err, st.wantVersion)
		}
	}
	for action, want := range map[string]int{"sale.pause": 1, "sale.resume": 1, "sale.message": 2, "sale.stock": 1, "sale.end": 1} {
		if n := auditCount(t, s, action); n != want {
			t.Errorf("%s audit rows %d, want %d", action, n, want)
		}
	}
	out, _ := s.Get(ctx, sale.ID)
	if out.Items[0].Quantity != 15 || !out.EndsAt.Equal(now) || out.Paused {
		t.Fatalf("after the steps %+v", out)
	}
	rem, err := s.stock.Remaining(ctx, sale.ID)
	if err != nil || rem[sale.Items[0].ID] != 15 {
		t.Fatalf("remaining %v, %v; want 15", rem, err)
	}
	// Refusals change nothing.
	for name, a := range map[string]flashsale.SaleAction{
		"stale":          {Kind: flashsale.ActionPause, IfVersion: 3},
		"unknown item":   {Kind: flashsale.ActionStock, ItemID: 999999, Add: 1},
		"add zero":       {Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: 0},
		"add over limit": {Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: flashsale.MaxStockAdd + 1},
	} {
		if _, err := act(a); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := s.Act(ctx, 999999, flashsale.SaleAction{Kind: flashsale.ActionPause}); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Errorf("unknown sale: %v, want NOT_FOUND", err)
	}
	after, _ := s.Get(ctx, sale.ID)
	if after.Version != 7 || after.Paused || after.Items[0].Quantity != 15 {
		t.Fatalf("a refusal changed the sale: %+v", after)
	}
	if _, err := s.Update(ctx, sale.ID, flashsale.SaleUpdate{IfVersion: 6}); flashsale.ErrorCode(err) != flashsale.CodeVersionConflict {
		t.Fatalf("stale update: %v, want VERSION_CONFLICT", err)
	}
}

// Of two writes naming the same version, exactly one applies.
func TestActRace(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Drop", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 10, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = s.Act(ctx, sale.ID, flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: sale.Items[0].ID, Add: 1, IfVersion: 1})
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch flashsale.ErrorCode(err) {
		case "":
			ok++
		case flashsale.CodeVersionConflict:
		default:
			t.Fatalf("unexpected %v", err)
		}
	}
	got, _ := s.Get(ctx, sale.ID)
	if ok != 1 || got.Items[0].Quantity != 11 || got.Version != 2 {
		t.Fatalf("%d writes applied, quantity %d, version %d; want 1, 11, 2", ok, got.Items[0].Quantity, got.Version)
	}
}

// A sharded sale's addition is spread over its shards, and an outbox row
// left behind (Redis failed after the commit) is applied once by
// AddPending, however often it runs.
func TestAddStockShardsAndOutbox(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	st := redisstock.New(rdb)
	s := NewStore(testenv.Postgres(t), rdb, st, nil)
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Hot", StartsAt: time.Now(), AdmissionRatePerSecond: 5, StockShards: 3,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 4, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID
	if _, err := s.Act(ctx, sale.ID, flashsale.SaleAction{Kind: flashsale.ActionStock, ItemID: item, Add: 5}); err != nil {
		t.Fatal(err)
	}
	rem, _ := st.Remaining(ctx, sale.ID)
	if rem[item] != 9 {
		t.Fatalf("remaining over the shards %d, want 9", rem[item])
	}
	for sh := range 3 {
		m, _ := st.ShardRemaining(ctx, sale.ID, sh)
		if want := []int64{2 + 2, 1 + 2, 1 + 1}[sh]; m[item] != want {
			t.Errorf("shard %d has %d, want %d", sh, m[item], want)
		}
	}
	// A row whose Redis step did not run.
	if _, err := s.pool.Exec(ctx, `UPDATE items SET quantity = quantity + 3 WHERE id = $1`, item); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO stock_adds (sale_id, item_id, units) VALUES ($1, $2, 3)`, sale.ID, item); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.AddPending(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rem, _ = st.Remaining(ctx, sale.ID)
	var left int
	_ = s.pool.QueryRow(ctx, `SELECT count(*) FROM stock_adds`).Scan(&left)
	if rem[item] != 12 || left != 0 {
		t.Fatalf("after AddPending: remaining %d, rows %d; want 12, 0", rem[item], left)
	}
	// A step retried (its row not deleted) adds nothing twice.
	for range 2 {
		if err := st.AddStock(ctx, sale.ID, 777, item, 3); err != nil {
			t.Fatal(err)
		}
	}
	if rem, _ = st.Remaining(ctx, sale.ID); rem[item] != 15 {
		t.Fatalf("a retried addition: remaining %d, want 15", rem[item])
	}
}

// TestActBesideOrderInserts: an operator's action does not wait for the
// order writer's transactions. An order insert holds KEY SHARE locks on
// its item and sale rows (the foreign keys) until it commits; the
// action's locks must not conflict with them, or an action taken during
// a sale waits for the writer, and deadlocks with it when the writer
// waits for the sale row the action holds.
func TestActBesideOrderInserts(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := NewStore(testenv.Postgres(t), rdb, redisstock.New(rdb), nil)
	sale, err := s.Create(ctx, flashsale.Sale{Name: "Live", StartsAt: time.Now(), AdmissionRatePerSecond: 5,
		Items: []flashsale.Item{{ProductID: 501, Quantity: 1, PriceCents: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID
	// What the writer's foreign-key checks hold, in its order: the item,
	// then the sale.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM items WHERE id = $1 FOR KEY SHARE`, item); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sales WHERE id = $1 FOR KEY SHARE`, sale.ID); err != nil {
		t.Fatal(err)
	}
	for _, a := range []flashsale.SaleAction{
		{Kind: flashsale.ActionStock, ItemID: item, Add: 2},
		{Kind: flashsale.ActionPause},
		{Kind: flashsale.ActionMessage, Text: "more soon"},
	} {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.Act(actx, sale.ID, a)
		cancel()
		if err != nil {
			t.Fatalf("%s while an order insert holds its key locks: %v", a.Kind, err)
		}
	}
}
