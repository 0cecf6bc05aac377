package events_test

import (
	"context"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pb33f/jsonschema/v6"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

const (
	schemaFile        = "../docs/order-event.schema.json"
	shopperSchemaFile = "../docs/shopper-event.schema.json"
)

func compileSchema(t *testing.T, file string) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	name := path.Base(file)
	if err := c.AddResource(name, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(name)
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// Every kind of event, as stored (and so as published), validates against
// the documented schema, and the schema refuses what the contract does.
func TestEventsMatchTheSchema(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	sch := compileSchema(t, schemaFile)
	at := time.Date(2026, 12, 2, 1, 2, 3, 0, time.UTC)
	base := events.Event{OccurredAt: at, SaleID: 7, ItemID: 1001, UserID: 42, PriceCents: 1999}
	cases := []events.Event{
		{Type: events.TypePending, Status: flashsale.OrderPending},
		{Type: events.TypePaid, Status: flashsale.OrderPaid, PaymentID: "pay_123"},
		{Type: events.TypePaid, Status: flashsale.OrderPaid},
		{Type: events.TypeExpired, Status: flashsale.OrderExpired},
		{Type: events.TypeCancelled, Status: flashsale.OrderCancelled},
		{Type: events.TypeRejected, Status: flashsale.OrderRejected, Reason: "SOLD_OUT"},
		{Type: events.TypePaymentRefused, Status: flashsale.OrderExpired, PaymentID: "pay_9", Reason: "ORDER_EXPIRED"},
	}
	for _, c := range cases {
		ev := base
		ev.Type, ev.Status, ev.PaymentID, ev.Reason = c.Type, c.Status, c.PaymentID, c.Reason
		ev.OrderID = uuid.NewString()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return events.Append(ctx, tx, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT body::text FROM order_events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(bodies) != len(cases) {
		t.Fatalf("%d bodies, want %d", len(bodies), len(cases))
	}
	for _, b := range bodies {
		if err := validate(sch, b); err != nil {
			t.Errorf("stored body %s does not match %s: %v", b, schemaFile, err)
		}
	}

	// What the schema must refuse.
	good := bodies[0]
	for name, bad := range map[string]string{
		"unknown field":           strings.Replace(good, `"version": 1`, `"version": 1, "extra": true`, 1),
		"other version":           strings.Replace(good, `"version": 1`, `"version": 2`, 1),
		"numeric userId":          strings.Replace(good, `"userId": "42"`, `"userId": 42`, 1),
		"status of another type":  strings.Replace(good, `"status": "PENDING"`, `"status": "PAID"`, 1),
		"refused without payment": strings.Replace(strings.Replace(good, `"order.pending"`, `"payment.refused"`, 1), `"version": 1`, `"version": 1, "reason": "x"`, 1),
		"local time":              strings.Replace(good, `Z"`, `+01:00"`, 1),
	} {
		if bad == good {
			t.Fatalf("%s: the replacement did not apply to %s", name, good)
		}
		if err := validate(sch, bad); err == nil {
			t.Errorf("%s: the schema accepted %s", name, bad)
		}
	}
}

// Both kinds of shopper event, as the outbox builds them, validate
// against the documented schema, and the schema refuses what the contract
// does.
func TestShopperEventsMatchTheSchema(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	sch := compileSchema(t, shopperSchemaFile)
	at := time.Date(2026, 12, 2, 1, 2, 3, 4000, time.UTC)
	var bodies []string
	for _, kind := range []flashsale.TurnKind{flashsale.TurnAdmitted, flashsale.TurnHeld} {
		var b string
		if err := pool.QueryRow(ctx, `SELECT flashsale_shopper_event_body(9, $1, $2, 7, 42, 0, $3)::text`,
			string(events.TypeShopperAdmitted), at, string(kind)).Scan(&b); err != nil {
			t.Fatal(err)
		}
		if err := validate(sch, b); err != nil {
			t.Errorf("stored body %s does not match %s: %v", b, shopperSchemaFile, err)
		}
		bodies = append(bodies, b)
	}
	good := bodies[0]
	for name, bad := range map[string]string{
		"unknown field":  strings.Replace(good, `"version": 1`, `"version": 1, "extra": true`, 1),
		"other type":     strings.Replace(good, `"shopper.admitted"`, `"order.paid"`, 1),
		"numeric userId": strings.Replace(good, `"userId": "42"`, `"userId": 42`, 1),
		"unknown kind":   strings.Replace(good, `"admitted"`, `"waiting"`, 1),
		"negative place": strings.Replace(good, `"place": 0`, `"place": -1`, 1),
		"local time":     strings.Replace(good, `Z"`, `+01:00"`, 1),
	} {
		if bad == good {
			t.Fatalf("%s: the replacement did not apply to %s", name, good)
		}
		if err := validate(sch, bad); err == nil {
			t.Errorf("%s: the schema accepted %s", name, bad)
		}
	}
}

func validate(sch *jsonschema.Schema, body string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

// The schema's type enum is the package's list of types.
func TestSchemaListsEveryType(t *testing.T) {
	b, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []events.Type{events.TypePending, events.TypePaid, events.TypeExpired, events.TypeCancelled, events.TypeRejected, events.TypePaymentRefused} {
		if !strings.Contains(string(b), `"`+string(typ)+`"`) {
			t.Errorf("%s does not list %s", schemaFile, typ)
		}
	}
	if got := slices.Index([]string{string(events.TypeFor("LOST"))}, ""); got != 0 {
		t.Errorf("TypeFor of an unknown status is %q, want empty", events.TypeFor("LOST"))
	}
}
