package loadtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/waitroom"
)

// Report is the result of a run. It encodes to JSON as is.
type Report struct {
	Scenario    string    `json:"scenario,omitempty"`
	Transport   string    `json:"transport"`
	SaleID      int64     `json:"saleId"`
	Shoppers    int       `json:"shoppers"`
	Quantity    int64     `json:"quantity"`
	Items       int       `json:"items"`
	Processes   int       `json:"processes"`
	SourceAddrs int       `json:"sourceAddrs"`
	StartedAt   time.Time `json:"startedAt"`
	OpensAt     time.Time `json:"opensAt"`
	FinishedAt  time.Time `json:"finishedAt"`
	ElapsedMs   int64     `json:"elapsedMs"`
	// Stopped says why the shopper phase ended: "done" (every shopper
	// finished), "paid" (paid = quantity), "quiet" (sold out and quiet
	// for SoldOutQuiet, KeepWaiting), "duration" or "canceled".
	Stopped string `json:"stopped"`

	// Steps: outcome counts and latencies per step (join, admitted_wait,
	// purchase, order_payable, pay, poll, order_get, hostile_*).
	Steps map[string]StepReport `json:"steps"`

	// Allocation is the sale's ("queue" or "race"), as the admin API
	// answered.
	Allocation string `json:"allocation,omitempty"`

	// Times relative to the opening, in ms; -1 when it never happened.
	// AllocationMs is when the last unit of an acknowledged order was
	// given to its shopper, in server time: the hold (queue order) or the
	// reservation (race order), read from the order ids (UUIDv7, made by
	// the server at that instant). In queue order it is the allocation
	// time and LastReservationMs the sell time; the first wave's holds
	// are given at the draw, before the opening (negative). Absent when
	// no acknowledged order was seen.
	AllocationMs       *int64  `json:"allocationMs,omitempty"`
	SellOutMs          int64   `json:"sellOutMs"`          // first SOLD_OUT a shopper saw
	FirstReservationMs int64   `json:"firstReservationMs"` // first 202
	LastReservationMs  int64   `json:"lastReservationMs"`  // last 202
	AdmissionsPerSec   float64 `json:"admissionsPerSecond"`

	Counters Counters `json:"counters"`
	// Shadow is what the run saw of its shadowed shoppers
	// (Config.ShadowShare; nil without).
	Shadow *ShadowReport           `json:"shadow,omitempty"`
	Orders OrdersReport            `json:"orders"`
	Queue  *flashsale.QueueFigures `json:"queue,omitempty"`

	Invariants []InvariantResult `json:"invariants"`
	// Summary is the machine-readable verdict (oversold, acknowledged
	// orders lost or rejected, stranded units, 5xx by route); Ledger
	// every order the run learnt of and how it ended; Timeline the times
	// of admissions and 202s. See the package doc.
	Summary  *Summary       `json:"summary,omitempty"`
	Ledger   []LedgerEntry  `json:"ledger"`
	Timeline Timeline       `json:"timeline"`
	Redis    *RedisReport   `json:"redis,omitempty"`
	Persist  *PersistReport `json:"persist,omitempty"` // order rows in PostgreSQL over time (DatabaseURL runs)
	// Fairness: who bought, by the draw's order (runs with Redis).
	Fairness *FairnessReport `json:"fairness,omitempty"`
	CPU      *CPUReport      `json:"cpu,omitempty"` // CPU-seconds by role, over the drop and the run (Linux /proc)

	Timeseries []Slot   `json:"timeseries"` // one per 100 ms from StartedAt
	Errors     []string `json:"errors,omitempty"`
	Notes      []string `json:"notes,omitempty"`
	Config     Config   `json:"config"`
}

// StepReport is one step's outcomes and latency.
type StepReport struct {
	Count     int64            `json:"count"`
	Outcomes  map[string]int64 `json:"outcomes"`
	Latency   Latency          `json:"latency"`
	Histogram []Bucket         `json:"histogram"`
}

// Latency percentiles in milliseconds.
type Latency struct {
	P50Ms  float64 `json:"p50Ms"`
	P90Ms  float64 `json:"p90Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	MeanMs float64 `json:"meanMs"`
}

// Bucket is one latency histogram bucket: Count samples ≤ LeMs (and above
// the previous bucket's LeMs).
type Bucket struct {
	LeMs  float64 `json:"leMs"`
	Count int64   `json:"count"`
}

// OrdersReport is what the run obtained and what the system persisted.
type OrdersReport struct {
	Reserved int64 `json:"reserved"` // 202s
	Users    int   `json:"users"`    // distinct users holding an order of the run
	PaidRun  int64 `json:"paidByRun"`
	// Persisted figures from GET /api/admin/sales/{id} after the quiet wait.
	Quantity  int64         `json:"quantity"`
	Remaining int64         `json:"remaining"`
	Sold      int64         `json:"sold"`
	Paid      int64         `json:"paid"`
	Expired   int64         `json:"expired"`
	Cancelled int64         `json:"cancelled"`
	Rejected  int64         `json:"rejected"`
	Items     []ItemFigures `json:"items"`
}

// InvariantResult is one check.
type InvariantResult struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Skipped bool   `json:"skipped,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// RedisReport is the Redis command counter (INFO stats
// total_commands_processed) over an idle baseline window and over the
// hostile-only phase of equal or known length.
type RedisReport struct {
	BaselineMs       int64 `json:"baselineMs"`
	BaselineCommands int64 `json:"baselineCommands"`
	Before           int64 `json:"before"`
	After            int64 `json:"after"`
	HostileMs        int64 `json:"hostileMs"`
	HostileCommands  int64 `json:"hostileCommands"` // After - Before (includes the one INFO)
	HostileRequests  int64 `json:"hostileRequests"`
	// ExcessPerRequest: (hostile commands − baseline rate × hostile time) /
	// hostile requests. About 0 when hostile requests never reach Redis.
	ExcessPerRequest float64 `json:"excessCommandsPerHostileRequest"`
	Error            string  `json:"error,omitempty"`
}

// Slot is one 100 ms interval: requests that ended in it and their
// outcomes ("step outcome" → count).
type Slot struct {
	TMs      int64            `json:"tMs"`
	Requests int64            `json:"requests"`
	Outcomes map[string]int64 `json:"outcomes,omitempty"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Err returns an error naming every failed invariant, nil when all hold.
func (r *Report) Err() error {
	var errs []error
	for _, c := range r.Invariants {
		if !c.OK && !c.Skipped {
			errs = append(errs, fmt.Errorf("invariant %q broken: %s", c.Name, c.Detail))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("loadtest: %w", errors.Join(errs...))
}

// shoppersPerAddr is about how many shoppers a run puts on each source
// address of each gateway: Shoppers / (SourceAddrs × gateways).
func shoppersPerAddr(cfg Config) int {
	spread := max(cfg.SourceAddrs, 1) * max(len(cfg.baseURLs()), 1)
	return (cfg.Shoppers + spread - 1) / spread
}

// spreadString names the run's spread: shoppers, addresses, gateways.
func spreadString(cfg Config) string {
	return fmt.Sprintf("%d shoppers, %d addresses, %d gateways", cfg.Shoppers, max(cfg.SourceAddrs, 1), len(cfg.baseURLs()))
}

// crowdedAddrWarning warns, before a WebSocket run, that it puts more
// shoppers on an address of a gateway than a gateway takes by default
// (empty: it does not).
func crowdedAddrWarning(cfg Config) string {
	if cfg.Transport != TransportWS || shoppersPerAddr(cfg) <= waitroom.DefaultMaxConnsPerIP {
		return ""
	}
	return fmt.Sprintf("warning: about %d shoppers on each source address of each gateway (%s), above the %d room "+
		"connections per address a gateway takes by default: expect 429s at join unless the gateways set "+
		"FLASHSALE_WS_MAX_CONNS_PER_ADDR higher; --source-addrs spreads them further",
		shoppersPerAddr(cfg), spreadString(cfg), waitroom.DefaultMaxConnsPerIP)
}

// joinRefusalNote explains shoppers refused at the door with 429 (empty:
// none were). A gateway caps the room connections one client address holds
// (FLASHSALE_WS_MAX_CONNS_PER_ADDR) and its bot defense limits addresses
// too, so a run with too few source addresses measures the refusals rather
// than the sale.
func joinRefusalNote(cfg Config, join StepReport) string {
	var refused int64
	for out, n := range join.Outcomes {
		if strings.Contains(out, "429") {
			refused += n
		}
	}
	if refused == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d shoppers were refused at join with 429: this run put about %d shoppers on each "+
		"source address of each gateway (%s), and a gateway takes %d room connections per address by default "+
		"(FLASHSALE_WS_MAX_CONNS_PER_ADDR) besides its bot-defense limits; raise --source-addrs to measure the "+
		"sale rather than the per-address limits",
		refused, join.Count, shoppersPerAddr(cfg), spreadString(cfg), waitroom.DefaultMaxConnsPerIP)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func stepReport(s *stepStats) StepReport {
	h := &s.Latency
	sr := StepReport{Count: h.N, Outcomes: s.Outcomes}
	if h.N > 0 {
		sr.Latency = Latency{
			P50Ms: ms(h.Quantile(0.50)), P90Ms: ms(h.Quantile(0.90)), P99Ms: ms(h.Quantile(0.99)),
			MaxMs: ms(time.Duration(h.MaxNs)), MeanMs: ms(time.Duration(h.SumNs / h.N)),
		}
	}
	idx := make([]int, 0, len(h.Counts))
	for i := range h.Counts {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		sr.Histogram = append(sr.Histogram, Bucket{LeMs: ms(bucketUpper(i)), Count: h.Counts[i]})
	}
	return sr
}

// fill sets the measured parts of the report from the merged partial.
func (r *Report) fill(p *partial) {
	r.Steps = make(map[string]StepReport, len(p.Steps))
	for name, s := range p.Steps {
		r.Steps[name] = stepReport(s)
	}
	rel := func(mark string) int64 {
		v, ok := p.Marks[mark]
		if !ok {
			return -1
		}
		return v - r.OpensAt.UnixMilli()
	}
	r.SellOutMs = rel(markFirstSoldOut)
	r.FirstReservationMs = rel(markFirstReserved)
	r.LastReservationMs = rel(markLastReserved)
	if a, ok := p.Marks[markFirstAdmitted]; ok {
		if b := p.Marks[markLastAdmitted]; b > a && p.Count.Admitted > 1 {
			r.AdmissionsPerSec = float64(p.Count.Admitted-1) / (float64(b-a) / 1000)
		}
	}
	r.Counters = p.Count
	r.Errors = p.Errors
	r.Timeline = Timeline{AdmissionsMs: relSorted(p.AdmitMs, r.OpensAt.UnixMilli()), ReservationsMs: relSorted(p.ReserveMs, r.OpensAt.UnixMilli())}
	last := -1
	for i := range p.Slots {
		last = max(last, i)
	}
	r.Timeseries = make([]Slot, last+1)
	for i := range r.Timeseries {
		r.Timeseries[i].TMs = int64(i) * slotWidth.Milliseconds()
		if s := p.Slots[i]; s != nil {
			r.Timeseries[i].Requests = s.Requests
			r.Timeseries[i].Outcomes = s.Outcomes
		}
	}
	for _, os := range p.Orders {
		if len(os) > 0 {
			r.Orders.Users++
		}
		for _, o := range os {
			if o.Via == 202 {
				r.Orders.Reserved++
			}
			if o.Status == "PAID" {
				r.Orders.PaidRun++
			}
		}
	}
}

// setFigures records the persisted figures of the admin API.
func (r *Report) setFigures(items []ItemFigures) {
	o := &r.Orders
	o.Items = items
	o.Quantity, o.Remaining, o.Sold, o.Paid, o.Expired, o.Cancelled, o.Rejected = 0, 0, 0, 0, 0, 0, 0
	for _, it := range items {
		o.Quantity += it.Quantity
		o.Remaining += it.Remaining
		o.Sold += it.Sold
		o.Paid += it.Paid
		o.Expired += it.Expired
		o.Cancelled += it.Cancelled
		o.Rejected += it.Rejected
	}
}

func live(status string) bool { return status == "" || status == "PENDING" || status == "PAID" }

// applyFinal sets the orders' statuses to the ledger's final verdicts
// (an order that could not be read keeps the status its shopper saw).
func applyFinal(orders map[int64][]orderRecord, ledger []LedgerEntry) {
	final := make(map[string]string, len(ledger))
	for _, e := range ledger {
		if e.Final != FinalUnknown && e.Final != "" {
			final[e.OrderID] = e.Final
		}
	}
	for _, os := range orders {
		for i := range os {
			if f, ok := final[os[i].OrderID]; ok {
				os[i].Status = f
			}
		}
	}
}

// checkRun adds the invariants that need only the run's own observations
// and the admin figures (nil figures: not available).
func (r *Report) checkRun(orders map[int64][]orderRecord, figs []ItemFigures, quiet bool, quietDetail string) {
	add := func(c InvariantResult) { r.Invariants = append(r.Invariants, c) }

	// One order per user, from the run's own answers.
	var dups []string
	for u, os := range orders {
		ids := map[string]bool{}
		for _, o := range os {
			if live(o.Status) {
				ids[o.OrderID] = true
			}
		}
		if len(ids) > 1 {
			dups = append(dups, fmt.Sprintf("user %d holds %d live orders", u, len(ids)))
		}
	}
	sort.Strings(dups)
	add(InvariantResult{Name: "one order per user (run)", OK: len(dups) == 0, Detail: joinMax(dups, 10)})

	// One order per identity key, across the accounts that share it.
	if r.Config.DuplicateIdentities > 0 {
		byKey := map[string]map[int64]bool{}
		for u, os := range orders {
			for _, o := range os {
				if live(o.Status) {
					k := identityKey(r.Config, u)
					if byKey[k] == nil {
						byKey[k] = map[int64]bool{}
					}
					byKey[k][u] = true
				}
			}
		}
		var twice []string
		for k, us := range byKey {
			if len(us) > 1 {
				twice = append(twice, fmt.Sprintf("%s: live orders of %d accounts", k, len(us)))
			}
		}
		sort.Strings(twice)
		add(InvariantResult{Name: "one order per identity key (run)", OK: len(twice) == 0, Detail: joinMax(twice, 10)})
	}

	// Orders ≤ stock, from the run's own 202s.
	perItem := map[int64]map[string]bool{}
	for _, os := range orders {
		for _, o := range os {
			if !live(o.Status) {
				continue
			}
			if perItem[o.ItemID] == nil {
				perItem[o.ItemID] = map[string]bool{}
			}
			perItem[o.ItemID][o.OrderID] = true
		}
	}
	quantity := map[int64]int64{}
	for _, it := range figs {
		quantity[it.ID] = it.Quantity
	}
	var over []string
	if figs != nil {
		for id, ids := range perItem {
			if q, ok := quantity[id]; !ok || int64(len(ids)) > q {
				over = append(over, fmt.Sprintf("item %d: %d live orders from the run, quantity %d", id, len(ids), q))
			}
		}
		sort.Strings(over)
		add(InvariantResult{Name: "orders ≤ stock (run)", OK: len(over) == 0, Detail: joinMax(over, 10)})
	} else {
		add(InvariantResult{Name: "orders ≤ stock (run)", Skipped: true, Detail: "no item quantities"})
	}

	if figs == nil {
		add(InvariantResult{Name: "orders ≤ stock (admin API)", Skipped: true, Detail: "admin API not read"})
		add(InvariantResult{Name: "conservation", Skipped: true, Detail: "admin API not read"})
		add(InvariantResult{Name: "payments persisted", Skipped: true, Detail: "admin API not read"})
		return
	}
	over = nil
	var cons []string
	var paid int64
	for _, it := range figs {
		if it.Sold > it.Quantity || it.Sold < 0 || it.Remaining < 0 {
			over = append(over, fmt.Sprintf("item %d: sold %d, remaining %d, quantity %d", it.ID, it.Sold, it.Remaining, it.Quantity))
		}
		if it.Remaining+it.Sold != it.Quantity {
			cons = append(cons, fmt.Sprintf("item %d: remaining %d + sold %d ≠ quantity %d", it.ID, it.Remaining, it.Sold, it.Quantity))
		}
		paid += it.Paid
	}
	add(InvariantResult{Name: "orders ≤ stock (admin API)", OK: len(over) == 0, Detail: joinMax(over, 10)})
	d := joinMax(cons, 10)
	if !quiet && quietDetail != "" {
		d = strings.TrimPrefix(d+"; "+quietDetail, "; ")
	}
	add(InvariantResult{Name: "conservation", OK: len(cons) == 0, Detail: d})
	var paidRun int64
	for _, os := range orders {
		for _, o := range os {
			if o.Status == "PAID" {
				paidRun++
			}
		}
	}
	add(InvariantResult{Name: "payments persisted", OK: paid >= paidRun,
		Detail: fmt.Sprintf("admin API paid %d, paid by the run %d", paid, paidRun)})
}

func joinMax(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], "; ") + fmt.Sprintf("; … %d more", len(s)-n)
	}
	return strings.Join(s, "; ")
}
