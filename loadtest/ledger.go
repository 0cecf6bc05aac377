package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale/auth"
)

// LedgerEntry is one order the run learnt of, and how it ended: read
// back as its owner through the API and, with DatabaseURL, from
// PostgreSQL once the run is over.
type LedgerEntry struct {
	OrderID string `json:"orderId"`
	UserID  int64  `json:"userId"`
	ItemID  int64  `json:"itemId"`
	// Gateway is the base URL whose answer first named the order.
	Gateway string `json:"gateway"`
	// Source: purchase_202, purchase_409, sale_order or purchase_503.
	Source string `json:"source"`
	// Acknowledged: a purchase was answered 202 with this order.
	Acknowledged bool  `json:"acknowledged"`
	AtMs         int64 `json:"atMs"`     // when it was learnt of (for a 202: the 202), ms since the opening
	AtUnixMs     int64 `json:"atUnixMs"` // the same, Unix ms
	// ShopperStatus is the last status the shopper saw.
	ShopperStatus      string `json:"shopperStatus,omitempty"`
	CancelledByShopper bool   `json:"cancelledByShopper,omitempty"`
	// APIStatus: GET /api/flash-sales/orders/{id} as its owner at the end:
	// the status, NOT_FOUND, or UNREAD <outcome> when no answer came.
	APIStatus string `json:"apiStatus"`
	// DBStatus: the order's row in PostgreSQL (ABSENT: none); empty when
	// the run has no DatabaseURL or could not read it.
	DBStatus string `json:"dbStatus,omitempty"`
	// Final is the verdict: the database row's status when there is one,
	// else the API's; MISSING when neither knows the order, UNKNOWN when
	// neither could be read.
	Final string `json:"final"`
}

// Final verdicts besides the order statuses.
const (
	FinalMissing = "MISSING"
	FinalUnknown = "UNKNOWN"
)

// Tally counts by "route status" (5xx) or "route outcome" (transport).
type Tally struct {
	Total   int64            `json:"total"`
	ByRoute map[string]int64 `json:"byRoute"`
}

func (t *Tally) add(k string, n int64) {
	if t.ByRoute == nil {
		t.ByRoute = map[string]int64{}
	}
	t.ByRoute[k] += n
	t.Total += n
}

// Summary is the machine-readable verdict of a run under faults
// (Report.Summary, JSON "summary"); the fault suite reads it.
type Summary struct {
	// Oversold is the largest excess of live orders over an item's
	// quantity, summed over items, seen by the admin API, PostgreSQL or
	// the run's own orders.
	Oversold int64 `json:"oversold"`
	// Acknowledged is the number of 202s (orders with acknowledged true
	// in the ledger). Each must end PENDING, PAID, EXPIRED or CANCELLED
	// by its shopper; the others are counted here:
	Acknowledged           int64 `json:"acknowledged"`
	AcknowledgedLost       int64 `json:"acknowledgedLost"`       // MISSING: neither the API nor PostgreSQL knows it
	AcknowledgedRejected   int64 `json:"acknowledgedRejected"`   // REJECTED
	AcknowledgedCancelled  int64 `json:"acknowledgedCancelled"`  // CANCELLED, not by its shopper
	AcknowledgedUnverified int64 `json:"acknowledgedUnverified"` // UNKNOWN: could not be read back
	// AcknowledgedInFlight: PENDING through the API but no row in
	// PostgreSQL yet (kept, still on its way).
	AcknowledgedInFlight int64 `json:"acknowledgedInFlight"`
	// OrdersBySource counts the ledger by source; UnacknowledgedRejected
	// counts orders never answered 202 that ended REJECTED (allowed: a
	// 503 said the reservation was uncertain).
	OrdersBySource         map[string]int64 `json:"ordersBySource"`
	UnacknowledgedRejected int64            `json:"unacknowledgedRejected"`
	// StrandedUnits is RemainingUnits when the run ended with the sale
	// open and shoppers still waiting (WaitingAdmin: queue.waiting of the
	// admin API; WaitingRun: the run's own shoppers still waiting), else 0.
	StrandedUnits  int64  `json:"strandedUnits"`
	RemainingUnits int64  `json:"remainingUnits"`
	SaleState      string `json:"saleState"`
	WaitingAdmin   int64  `json:"waitingAdmin"`
	WaitingRun     int64  `json:"waitingRun"`
	// HTTP5xx counts every 5xx answer but a 503 with Retry-After, by
	// "route status" (routes: the step names, ws_connect, admin,
	// ledger_order_get); HTTP503RetryAfter counts those 503s, and
	// NetworkErrors the transport errors (conn_refused, conn_reset,
	// conn_error, timeout) by "route outcome": what a dead gateway gives.
	HTTP5xx           Tally `json:"http5xx"`
	HTTP503RetryAfter Tally `json:"http503RetryAfter"`
	NetworkErrors     Tally `json:"networkErrors"`
	// Reconnects, GatewayMoves and PlacesLost are the shoppers' counters
	// of the same names.
	Reconnects   int64 `json:"reconnects"`
	GatewayMoves int64 `json:"gatewayMoves"`
	PlacesLost   int64 `json:"placesLost"`
	// Examples lists up to 10 order ids per broken count
	// (acknowledgedLost, acknowledgedRejected, acknowledgedCancelled,
	// acknowledgedUnverified).
	Examples map[string][]string `json:"examples,omitempty"`
	// LedgerError says why the ledger's database read failed.
	LedgerError string `json:"ledgerError,omitempty"`
}

// Timeline holds the times, in ms since the opening and sorted, of every
// admission token a shopper received and of every 202: a fault at time T
// recovered at the first of each after T.
type Timeline struct {
	AdmissionsMs   []int64 `json:"admissionsMs"`
	ReservationsMs []int64 `json:"reservationsMs"`
}

func relSorted(unixMs []int64, opensMs int64) []int64 {
	out := make([]int64, len(unixMs))
	for i, v := range unixMs {
		out[i] = v - opensMs
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// buildLedger flattens the run's orders into ledger entries, in the
// order they were learnt of.
func buildLedger(orders map[int64][]orderRecord, opensMs int64) []LedgerEntry {
	var out []LedgerEntry
	for u, os := range orders {
		for _, o := range os {
			src := o.Source
			if src == "" {
				src = SourcePurchase409
				if o.acked() {
					src = SourcePurchase202
				}
			}
			e := LedgerEntry{OrderID: o.OrderID, UserID: u, ItemID: o.ItemID, Gateway: o.Gateway, Source: src,
				Acknowledged: o.acked(), AtUnixMs: o.AtUnixMs, ShopperStatus: o.Status, CancelledByShopper: o.Cancelled}
			if o.AtUnixMs > 0 {
				e.AtMs = o.AtUnixMs - opensMs
			}
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].AtUnixMs != out[j].AtUnixMs {
			return out[i].AtUnixMs < out[j].AtUnixMs
		}
		return out[i].OrderID < out[j].OrderID
	})
	return out
}

// readBackAPI reads every ledger entry's order through the API as its
// owner, over the run's gateways in turn: an answer that did not come,
// a 429 or a 5xx is tried again (up to 8 times) on the next gateway.
// Bounded by ctx; an entry not read by then stays UNREAD.
func readBackAPI(ctx context.Context, cfg Config, hc *httpClient, bases []string, rec *recorder, ledger []LedgerEntry) {
	if len(ledger) == 0 {
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range min(32, len(ledger)) {
		wg.Go(func() {
			gw := w % len(bases)
			bo := &backoff{rng: rand.New(rand.NewPCG(cfg.Seed^0x510e527fade682d1, uint64(w)))}
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= len(ledger) {
					return
				}
				e := &ledger[k]
				tok, err := auth.Mint(cfg.JWTSecret, e.UserID, false, time.Hour, time.Now())
				if err != nil {
					e.APIStatus = "UNREAD token"
					continue
				}
				e.APIStatus = "UNREAD timeout"
				for attempt := 0; attempt < 8 && ctx.Err() == nil; attempt++ {
					r, err := do(ctx, hc, http.MethodGet, bases[gw]+"/api/flash-sales/orders/"+e.OrderID, bearer(tok), nil)
					rec.response(ctx, "ledger_order_get", r, err)
					if err == nil && r.Status == http.StatusOK {
						var b struct {
							Status string `json:"status"`
						}
						if json.Unmarshal(r.Body, &b) == nil && b.Status != "" {
							e.APIStatus = b.Status
							break
						}
					}
					if err == nil && r.Status == http.StatusNotFound {
						e.APIStatus = "NOT_FOUND"
						break
					}
					if err != nil {
						e.APIStatus = "UNREAD " + errOutcome(err)
					} else {
						e.APIStatus = "UNREAD " + r.outcome()
					}
					gw = (gw + 1) % len(bases)
					d := bo.next()
					if err == nil && r.HasRetryAfter {
						d = retryDelay(r)
					}
					if !sleepCtx(ctx, d) {
						break
					}
				}
				bo.reset()
			}
		})
	}
	wg.Wait()
}

// readBackDB reads the status of every order row of the sale.
func readBackDB(ctx context.Context, url string, saleID int64) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("ledger: connect: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT id::text, status FROM orders WHERE sale_id = $1`, saleID)
	if err != nil {
		return nil, fmt.Errorf("ledger: orders: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			return nil, fmt.Errorf("ledger: orders: %w", err)
		}
		out[strings.ToLower(id)] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: orders: %w", err)
	}
	return out, nil
}

// settle sets each entry's DBStatus (db nil: not read) and Final.
func settle(ledger []LedgerEntry, db map[string]string) {
	for i := range ledger {
		e := &ledger[i]
		dbStatus, inDB := "", false
		if db != nil {
			dbStatus, inDB = db[strings.ToLower(e.OrderID)]
			e.DBStatus = dbStatus
			if !inDB {
				e.DBStatus = "ABSENT"
			}
		}
		switch {
		case inDB:
			// PostgreSQL is the source of truth, and a REJECTED
			// tombstone is only there.
			e.Final = dbStatus
		case e.APIStatus == "NOT_FOUND":
			e.Final = FinalMissing
		case strings.HasPrefix(e.APIStatus, "UNREAD") || e.APIStatus == "":
			e.Final = FinalUnknown
		default:
			e.Final = e.APIStatus
		}
	}
}

// tallyLedger fills the ledger counts of the summary.
func (sm *Summary) tallyLedger(ledger []LedgerEntry, dbRead bool) {
	sm.OrdersBySource = map[string]int64{}
	example := func(k, id string) {
		if sm.Examples == nil {
			sm.Examples = map[string][]string{}
		}
		if len(sm.Examples[k]) < 10 {
			sm.Examples[k] = append(sm.Examples[k], id)
		}
	}
	for _, e := range ledger {
		sm.OrdersBySource[e.Source]++
		if !e.Acknowledged {
			if e.Final == "REJECTED" {
				sm.UnacknowledgedRejected++
			}
			continue
		}
		sm.Acknowledged++
		switch e.Final {
		case "PENDING":
			if dbRead && e.DBStatus == "ABSENT" {
				sm.AcknowledgedInFlight++
			}
		case "PAID", "EXPIRED":
		case "CANCELLED":
			if !e.CancelledByShopper {
				sm.AcknowledgedCancelled++
				example("acknowledgedCancelled", e.OrderID)
			}
		case "REJECTED":
			sm.AcknowledgedRejected++
			example("acknowledgedRejected", e.OrderID)
		case FinalMissing:
			sm.AcknowledgedLost++
			example("acknowledgedLost", e.OrderID)
		default:
			sm.AcknowledgedUnverified++
			example("acknowledgedUnverified", e.OrderID)
		}
	}
}

// tallyResponses fills the 5xx and transport-error counts.
func (sm *Summary) tallyResponses(server5xx, netErrors map[string]int64) {
	sm.HTTP5xx = Tally{ByRoute: map[string]int64{}}
	sm.HTTP503RetryAfter = Tally{ByRoute: map[string]int64{}}
	sm.NetworkErrors = Tally{ByRoute: map[string]int64{}}
	for k, n := range server5xx {
		if strings.HasSuffix(k, " 503 with Retry-After") {
			sm.HTTP503RetryAfter.add(strings.TrimSuffix(k, " with Retry-After"), n)
		} else {
			sm.HTTP5xx.add(k, n)
		}
	}
	for k, n := range netErrors {
		sm.NetworkErrors.add(k, n)
	}
}

// saleOpen reports a sale state in which units left should still sell.
func saleOpen(state string) bool {
	return state == "" || state == "OPEN" || state == "SOLD_OUT"
}

// strand sets the stranded-stock figures from the admin figures read
// after the quiet wait (nil: not read) and the run's waiting shoppers.
func (sm *Summary) strand(figs *adminSale, waitingRun int64) {
	sm.WaitingRun = waitingRun
	if figs == nil {
		return
	}
	sm.SaleState = figs.State
	for _, it := range figs.Items {
		sm.RemainingUnits += max(it.Remaining, 0)
	}
	if figs.Queue != nil {
		sm.WaitingAdmin = figs.Queue.Waiting
	}
	if saleOpen(figs.State) && (sm.WaitingAdmin > 0 || waitingRun > 0) {
		sm.StrandedUnits = sm.RemainingUnits
	}
}

// oversoldRun is the run's own view: live orders per item over quantity.
func oversoldRun(orders map[int64][]orderRecord, figs []ItemFigures) int64 {
	perItem := map[int64]map[string]bool{}
	for _, os := range orders {
		for _, o := range os {
			if live(o.Status) {
				if perItem[o.ItemID] == nil {
					perItem[o.ItemID] = map[string]bool{}
				}
				perItem[o.ItemID][o.OrderID] = true
			}
		}
	}
	var n int64
	for _, it := range figs {
		n += max(int64(len(perItem[it.ID]))-it.Quantity, 0)
	}
	return n
}

func oversoldAdmin(figs []ItemFigures) int64 {
	var n int64
	for _, it := range figs {
		n += max(it.Sold-it.Quantity, 0)
	}
	return n
}

// checkSummary adds the invariants of the summary: acknowledged orders
// kept, no stranded stock, no 5xx but a 503 with Retry-After.
func (r *Report) checkSummary() {
	sm := r.Summary
	add := func(c InvariantResult) { r.Invariants = append(r.Invariants, c) }
	bad := sm.AcknowledgedLost + sm.AcknowledgedRejected + sm.AcknowledgedCancelled + sm.AcknowledgedUnverified
	d := fmt.Sprintf("%d acknowledged: %d lost, %d rejected, %d cancelled not by the shopper, %d unverified; %d in flight",
		sm.Acknowledged, sm.AcknowledgedLost, sm.AcknowledgedRejected, sm.AcknowledgedCancelled, sm.AcknowledgedUnverified, sm.AcknowledgedInFlight)
	var keys []string
	for k := range sm.Examples {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		d += fmt.Sprintf("; %s e.g. %s", k, strings.Join(sm.Examples[k], ", "))
	}
	add(InvariantResult{Name: "acknowledged orders kept", OK: bad == 0, Detail: d})
	add(InvariantResult{Name: "no stranded stock", OK: sm.StrandedUnits == 0,
		Detail: fmt.Sprintf("%d units stranded (%d remaining, sale %q, %d waiting by the admin API, %d shoppers of the run still waiting)",
			sm.StrandedUnits, sm.RemainingUnits, sm.SaleState, sm.WaitingAdmin, sm.WaitingRun)})
	add(InvariantResult{Name: "no 5xx but 503 with Retry-After", OK: sm.HTTP5xx.Total == 0,
		Detail: fmt.Sprintf("%d: %s", sm.HTTP5xx.Total, tallyString(sm.HTTP5xx))})
}

func tallyString(t Tally) string {
	var keys []string
	for k := range t.ByRoute {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s × %d", k, t.ByRoute[k]))
	}
	return joinMax(parts, 10)
}

// allocationMs is the latest instant, relative to opens, at which the
// server gave a shopper the unit of an acknowledged order: the time in
// the order's id (UUIDv7, taken when the hold or reservation was made).
// nil when no acknowledged order has such an id.
func allocationMs(ledger []LedgerEntry, opens time.Time) *int64 {
	var last *int64
	for _, e := range ledger {
		if !e.Acknowledged {
			continue
		}
		id, err := uuid.Parse(e.OrderID)
		if err != nil || id.Version() != 7 {
			continue
		}
		sec, nsec := id.Time().UnixTime()
		ms := time.Unix(sec, nsec).UnixMilli() - opens.UnixMilli()
		if last == nil || ms > *last {
			last = &ms
		}
	}
	return last
}
