package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale"
)

// adminSale is GET /api/admin/sales/{id} (CONTRACT section 3).
type adminSale struct {
	ID         int64                   `json:"id"`
	StartsAt   time.Time               `json:"startsAt"`
	State      string                  `json:"state"`
	Allocation string                  `json:"allocation"`
	Items      []ItemFigures           `json:"items"`
	Queue      *flashsale.QueueFigures `json:"queue,omitempty"`
}

// ItemFigures are one item's persisted figures from the admin API.
type ItemFigures struct {
	ID        int64 `json:"id"`
	ProductID int64 `json:"productId,omitempty"`
	Quantity  int64 `json:"quantity"`
	Remaining int64 `json:"remaining"`
	Sold      int64 `json:"sold"`
	Paid      int64 `json:"paid"`
	Expired   int64 `json:"expired"`
	Cancelled int64 `json:"cancelled"`
	Rejected  int64 `json:"rejected"`
}

func (a *adminSale) info() saleInfo {
	s := saleInfo{ID: a.ID, OpensAt: a.StartsAt}
	for _, it := range a.Items {
		s.Items = append(s.Items, itemInfo{ID: it.ID, Quantity: it.Quantity})
	}
	return s
}

// admin talks to the operator API through the run's gateways: a read
// that gets no answer, or a 5xx, is tried on the next one, so the run
// still reads its figures when the gateway it used is gone.
type admin struct {
	hc    *httpClient
	bases []string
	cur   atomic.Int64 // index of the gateway in use
	tok   string
	rec   *recorder // nil: answers not counted
}

func (a *admin) base() string { return a.bases[int(a.cur.Load())%len(a.bases)] }

// createSale creates the run's sale: Quantity units split over Items items,
// opening StartsIn from now. It validates the sale before sending it, so a
// bad setting fails at once, in the words the gateway would use.
func (a *admin) createSale(ctx context.Context, cfg Config, now time.Time) (*adminSale, error) {
	name := "loadtest"
	if cfg.Scenario != "" {
		name += " " + cfg.Scenario
	}
	sale := flashsale.Sale{
		Name:                   fmt.Sprintf("%s %s", name, now.UTC().Format(time.RFC3339)),
		StartsAt:               now.Add(cfg.StartsIn).UTC(),
		AdmissionRatePerSecond: cfg.AdmissionRate,
		StockShards:            cfg.StockShards,
		Allocation:             cfg.Allocation,
		ClaimWindow:            cfg.ClaimWindow,
	}
	for i := range cfg.Items {
		q := cfg.Quantity / cfg.Items
		if i < cfg.Quantity%cfg.Items {
			q++
		}
		sale.Items = append(sale.Items, flashsale.Item{ProductID: 501 + int64(i), Quantity: int64(q), PriceCents: 1999,
			Name: fmt.Sprintf("Load item %d", i+1), Currency: flashsale.DefaultCurrency})
	}
	if err := sale.Validate(); err != nil {
		return nil, fmt.Errorf("loadtest: create sale: %w", err)
	}
	type item struct {
		ProductID  int64  `json:"productId"`
		Quantity   int64  `json:"quantity"`
		PriceCents int64  `json:"priceCents"`
		Name       string `json:"name"`
		Currency   string `json:"currency"`
	}
	items := make([]item, len(sale.Items))
	for i, it := range sale.Items {
		items[i] = item{ProductID: it.ProductID, Quantity: it.Quantity, PriceCents: it.PriceCents, Name: it.Name, Currency: it.Currency}
	}
	body := map[string]any{
		"name":                   sale.Name,
		"startsAt":               sale.StartsAt.Format(time.RFC3339Nano),
		"admissionRatePerSecond": sale.AdmissionRatePerSecond,
		"items":                  items,
	}
	if sale.StockShards > 0 {
		body["stockShards"] = sale.StockShards
	}
	if sale.Allocation != "" {
		body["allocation"] = sale.Allocation
	}
	if sale.ClaimWindow > 0 {
		body["claimWindowSeconds"] = int(sale.ClaimWindow / time.Second)
	}
	r, err := do(ctx, a.hc, http.MethodPost, a.bases[0]+"/api/admin/sales", bearer(a.tok), body)
	if err != nil {
		return nil, fmt.Errorf("loadtest: create sale: %w", err)
	}
	if r.Status != http.StatusCreated && r.Status != http.StatusOK {
		return nil, fmt.Errorf("loadtest: create sale: HTTP %d: %s", r.Status, trim(r.Body))
	}
	var s adminSale
	if err := json.Unmarshal(r.Body, &s); err != nil {
		return nil, fmt.Errorf("loadtest: create sale: %w", err)
	}
	if s.ID == 0 || len(s.Items) == 0 {
		return nil, fmt.Errorf("loadtest: create sale: answer without id or items: %s", trim(r.Body))
	}
	return &s, nil
}

func (a *admin) getSale(ctx context.Context, id int64) (*adminSale, error) {
	var r apiResult
	var err error
	for range a.bases {
		r, err = do(ctx, a.hc, http.MethodGet, fmt.Sprintf("%s/api/admin/sales/%d", a.base(), id), bearer(a.tok), nil)
		if a.rec != nil {
			a.rec.response(ctx, "admin", r, err)
		}
		if ctx.Err() != nil || (err == nil && r.Status < 500) {
			break
		}
		a.cur.Add(1)
	}
	if err != nil {
		return nil, fmt.Errorf("loadtest: get sale %d: %w", id, err)
	}
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("loadtest: get sale %d: HTTP %d: %s", id, r.Status, trim(r.Body))
	}
	var s adminSale
	if err := json.Unmarshal(r.Body, &s); err != nil {
		return nil, fmt.Errorf("loadtest: get sale %d: %w", id, err)
	}
	return &s, nil
}

// waitReady polls adminURL/readyz until 200 (bounded by ctx and 30 s).
func waitReady(ctx context.Context, hc *httpClient, adminURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last string
	for {
		r, err := do(ctx, hc, http.MethodGet, adminURL+"/readyz", nil, nil)
		if err == nil && r.Status == http.StatusOK {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("HTTP %d", r.Status)
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return fmt.Errorf("loadtest: %s/readyz not ready: %s", adminURL, last)
		}
	}
}

func trim(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}
