package events_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func sampleEvent(orderID string) events.Event {
	return events.Event{
		Type: events.TypePaid, OccurredAt: time.Date(2026, 12, 2, 1, 2, 3, 456789000, time.UTC),
		OrderID: orderID, SaleID: 7, ItemID: 1001, UserID: 42, Status: flashsale.OrderPaid,
		PriceCents: 1999, PaymentID: "pay_1",
	}
}

func TestAppendStoresTheEventAsPublished(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	oid := uuid.NewString()
	for range 2 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return events.Append(ctx, tx, sampleEvent(oid)) }); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT id, order_id::text, type, body::text FROM order_events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		var order, typ, body string
		if err := rows.Scan(&id, &order, &typ, &body); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		var raw map[string]any
		if err := json.Unmarshal([]byte(body), &raw); err != nil {
			t.Fatal(err)
		}
		if _, ok := raw["reason"]; ok {
			t.Errorf("body %s has a reason, want none", body)
		}
		if got, want := raw["userId"], "42"; got != want {
			t.Errorf("userId = %#v, want %q (a string)", got, want)
		}
		var ev events.Event
		if err := json.Unmarshal([]byte(body), &ev); err != nil {
			t.Fatal(err)
		}
		want := sampleEvent(oid)
		want.Version, want.EventID = 1, id
		if ev != want {
			t.Errorf("stored event\n got %+v\nwant %+v", ev, want)
		}
		if order != oid || typ != string(events.TypePaid) {
			t.Errorf("columns order=%s type=%s, want %s %s", order, typ, oid, events.TypePaid)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] >= ids[1] {
		t.Errorf("ids %v, want two increasing", ids)
	}
}

func TestAppendRefusesBadEvents(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	oid := uuid.NewString()
	cases := []struct {
		name   string
		change func(*events.Event)
	}{
		{"unknown type", func(e *events.Event) { e.Type = "order.shipped" }},
		{"no time", func(e *events.Event) { e.OccurredAt = time.Time{} }},
		{"bad order id", func(e *events.Event) { e.OrderID = "not-a-uuid-not-a-uuid-not-a-uuid-123" }},
		{"short order id", func(e *events.Event) { e.OrderID = "abc" }},
		{"type and status disagree", func(e *events.Event) { e.Status = flashsale.OrderExpired }},
		{"unknown status", func(e *events.Event) { e.Status = "LOST" }},
		{"no user", func(e *events.Event) { e.UserID = 0 }},
		{"negative price", func(e *events.Event) { e.PriceCents = -1 }},
		{"refused without payment", func(e *events.Event) {
			e.Type, e.PaymentID = events.TypePaymentRefused, ""
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev := sampleEvent(oid)
			c.change(&ev)
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return events.Append(ctx, tx, ev) })
			if err == nil || !strings.Contains(err.Error(), "events.Append") {
				t.Fatalf("Append(%+v) = %v, want an events.Append error", ev, err)
			}
		})
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM order_events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d events stored after refusals, want 0", n)
	}
}

func TestAppendRollsBackWithTheChange(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Append(ctx, tx, sampleEvent(uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM order_events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d events after a rolled-back change, want 0", n)
	}
}
