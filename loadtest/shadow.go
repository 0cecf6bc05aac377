package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
)

// enableShadowQueue turns the bot defense's shadow queue on for the run
// (Config.ShadowShare): the stored settings, read back, with
// shadowQueue.riskAbove at shadowRiskAbove and, with
// DuplicateIdentities, the identity rule. The other knobs stay as the
// operator left them.
func (a *admin) enableShadowQueue(ctx context.Context, cfg Config) error {
	r, err := do(ctx, a.hc, http.MethodGet, a.base()+"/api/admin/settings", bearer(a.tok), nil)
	if err != nil {
		return fmt.Errorf("loadtest: read settings: %w", err)
	}
	if r.Status != http.StatusOK {
		return fmt.Errorf("loadtest: read settings: HTTP %d: %s", r.Status, trim(r.Body))
	}
	var st map[string]any
	if err := json.Unmarshal(r.Body, &st); err != nil {
		return fmt.Errorf("loadtest: read settings: %w", err)
	}
	rules := map[string]bool{}
	if cfg.DuplicateIdentities > 0 {
		rules["identity"] = true
	}
	st["shadowQueue"] = map[string]any{"rules": rules, "riskAbove": shadowRiskAbove}
	delete(st, "version")
	delete(st, "preset")
	r, err = do(ctx, a.hc, http.MethodPut, a.base()+"/api/admin/settings", bearer(a.tok), st)
	if err != nil {
		return fmt.Errorf("loadtest: store settings: %w", err)
	}
	if r.Status != http.StatusOK {
		return fmt.Errorf("loadtest: store settings: HTTP %d: %s", r.Status, trim(r.Body))
	}
	return nil
}

// shadowList is the sale's shadow queue as the console reads it.
type shadowList struct {
	Shadowed int64            `json:"shadowed"`
	ByRule   map[string]int64 `json:"byRule"`
	Shoppers []struct {
		UserID int64  `json:"userId"`
		Rule   string `json:"rule"`
	} `json:"shoppers"`
}

// ShadowReport is what the run saw of its shadowed shoppers.
type ShadowReport struct {
	// Drawn: shoppers whose token carried the shadow risk claim;
	// Admitted: those of them that saw an admission.
	Drawn    int64 `json:"drawn"`
	Admitted int64 `json:"admitted"`
	// Server: the sale's shadow queue (GET .../shadow): how many are in
	// it and why; Listed: how many of them were read (at most 1000);
	// WithOrders: those holding a live order.
	Server     map[string]int64 `json:"server"`
	InQueue    int64            `json:"inQueue"`
	Listed     int              `json:"listed"`
	WithOrders int              `json:"withOrders"`
	Error      string           `json:"error,omitempty"`
}

// checkShadow reads the sale's shadow queue and checks that no shadowed
// shopper was admitted (the run's own observation of the drawn ones) or
// holds a live order (every shopper the server lists, up to 1000).
func (r *Report) checkShadow(ctx context.Context, a *admin, saleID int64, orders map[int64][]orderRecord) {
	sr := &ShadowReport{Drawn: r.Counters.Shadowed, Admitted: r.Counters.ShadowAdmitted}
	r.Shadow = sr
	add := func(c InvariantResult) { r.Invariants = append(r.Invariants, c) }
	add(InvariantResult{Name: "shadowed shoppers never admitted (run)", OK: sr.Drawn > 0 && sr.Admitted == 0,
		Detail: fmt.Sprintf("%d of %d shoppers drawn for the shadow queue saw an admission", sr.Admitted, sr.Drawn)})
	res, err := do(ctx, a.hc, http.MethodGet, a.base()+"/api/admin/sales/"+strconv.FormatInt(saleID, 10)+"/shadow?limit=1000", bearer(a.tok), nil)
	var q shadowList
	switch {
	case err != nil:
		sr.Error = err.Error()
	case res.Status != http.StatusOK:
		sr.Error = fmt.Sprintf("HTTP %d: %s", res.Status, trim(res.Body))
	default:
		if err := json.Unmarshal(res.Body, &q); err != nil {
			sr.Error = err.Error()
		}
	}
	if sr.Error != "" {
		add(InvariantResult{Name: "shadowed shoppers never buy (admin API)", Skipped: true, Detail: sr.Error})
		return
	}
	sr.Server, sr.InQueue, sr.Listed = q.ByRule, q.Shadowed, len(q.Shoppers)
	var bought []string
	for _, s := range q.Shoppers {
		for _, o := range orders[s.UserID] {
			if live(o.Status) {
				bought = append(bought, fmt.Sprintf("user %d (%s): order %s", s.UserID, s.Rule, o.OrderID))
				break
			}
		}
	}
	sort.Strings(bought)
	sr.WithOrders = len(bought)
	add(InvariantResult{Name: "shadowed shoppers never buy (admin API)", OK: len(bought) == 0 && sr.Listed > 0,
		Detail: fmt.Sprintf("%d in the shadow queue (%v), %d listed; %d hold an order %s", sr.InQueue, sr.Server, sr.Listed, len(bought), joinMax(bought, 10))})
}
