package wiring

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
)

// errUnavailable is what a caller sees while a store cannot be reached:
// the gateway answers it 503 with Retry-After.
var errUnavailable = flashsale.Errorf(flashsale.CodeUnavailable, "temporarily unavailable; retry shortly")

// availability marks an error that means a store is down or too slow
// (PostgreSQL's connection and shutdown errors, a refused or broken
// connection, a deadline) as UNAVAILABLE, so that an outage is answered
// 503 with Retry-After, never 500. Domain answers and other errors (a bug)
// pass unchanged.
func availability(err error) error {
	if err == nil || flashsale.ErrorCode(err) != flashsale.CodeInternal || !postgres.Unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", errUnavailable, err)
}

// availSaleAdmin is the operator API's sale store with outages answered
// UNAVAILABLE.
type availSaleAdmin struct{ gateway.SaleAdmin }

func (s availSaleAdmin) Create(ctx context.Context, in flashsale.Sale) (flashsale.Sale, error) {
	out, err := s.SaleAdmin.Create(ctx, in)
	return out, availability(err)
}

func (s availSaleAdmin) Get(ctx context.Context, id int64) (flashsale.Sale, error) {
	out, err := s.SaleAdmin.Get(ctx, id)
	return out, availability(err)
}

func (s availSaleAdmin) List(ctx context.Context) ([]flashsale.Sale, error) {
	out, err := s.SaleAdmin.List(ctx)
	return out, availability(err)
}

func (s availSaleAdmin) Update(ctx context.Context, id int64, u flashsale.SaleUpdate) (flashsale.Sale, error) {
	out, err := s.SaleAdmin.Update(ctx, id, u)
	return out, availability(err)
}

func (s availSaleAdmin) Act(ctx context.Context, id int64, a flashsale.SaleAction) (flashsale.Sale, error) {
	out, err := s.SaleAdmin.Act(ctx, id, a)
	return out, availability(err)
}

func (s availSaleAdmin) Figures(ctx context.Context, saleID int64) ([]flashsale.ItemFigures, error) {
	out, err := s.SaleAdmin.Figures(ctx, saleID)
	return out, availability(err)
}

// availSettings is the bot-defense settings store with outages answered
// UNAVAILABLE.
type availSettings struct{ gateway.SettingsStore }

func (s availSettings) Get(ctx context.Context) (json.RawMessage, error) {
	out, err := s.SettingsStore.Get(ctx)
	return out, availability(err)
}

func (s availSettings) PutIf(ctx context.Context, actor string, ifVersion int64, body json.RawMessage) (json.RawMessage, error) {
	out, err := s.SettingsStore.PutIf(ctx, actor, ifVersion, body)
	return out, availability(err)
}

func (s availSettings) ApplyPreset(ctx context.Context, actor, name string) (json.RawMessage, error) {
	out, err := s.SettingsStore.ApplyPreset(ctx, actor, name)
	return out, availability(err)
}

func (s availSettings) Audit(ctx context.Context, limit int) (json.RawMessage, error) {
	out, err := s.SettingsStore.Audit(ctx, limit)
	return out, availability(err)
}

// availQueue is the waiting room's polling API and figures with outages
// answered UNAVAILABLE (the WebSocket path answers its own errors).
type availQueue struct{ gateway.Queue }

func (q availQueue) Join(ctx context.Context, p flashsale.Principal, saleID int64, ip netip.Addr, pow json.RawMessage) (any, error) {
	out, err := q.Queue.Join(ctx, p, saleID, ip, pow)
	return out, availability(err)
}

func (q availQueue) Status(ctx context.Context, p flashsale.Principal, saleID int64) (any, error) {
	out, err := q.Queue.Status(ctx, p, saleID)
	return out, availability(err)
}

func (q availQueue) Choose(ctx context.Context, p flashsale.Principal, saleID, itemID int64) error {
	return availability(q.Queue.Choose(ctx, p, saleID, itemID))
}

func (q availQueue) Figures(ctx context.Context, saleID int64) (flashsale.QueueFigures, error) {
	out, err := q.Queue.Figures(ctx, saleID)
	return out, availability(err)
}
