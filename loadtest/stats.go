package loadtest

import (
	"context"
	"errors"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Latency histogram: geometric buckets from histBase growing by histGrowth,
// so any percentile read from it is within 5% of the true value. Bucket i
// holds latencies in (upper(i-1), upper(i)]; the last bucket is open.
const (
	histBase    = 10 * time.Microsecond
	histGrowth  = 1.05
	histBuckets = 400 // upper(399) ≈ 10µs·1.05^399 ≈ 50 min
	slotWidth   = 100 * time.Millisecond
)

var logGrowth = math.Log(histGrowth)

func bucketOf(d time.Duration) int {
	if d <= histBase {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(histBase))/logGrowth - 1e-9))
	if i >= histBuckets {
		return histBuckets - 1
	}
	return i
}

// bucketUpper is the inclusive upper bound of bucket i.
func bucketUpper(i int) time.Duration {
	return time.Duration(float64(histBase) * math.Pow(histGrowth, float64(i)))
}

// Hist is a mergeable latency histogram.
type Hist struct {
	Counts map[int]int64 `json:"counts,omitempty"` // bucket index → count (sparse)
	N      int64         `json:"n"`
	SumNs  int64         `json:"sumNs"`
	MaxNs  int64         `json:"maxNs"`
	MinNs  int64         `json:"minNs"`
}

func (h *Hist) add(d time.Duration) {
	if d < 0 {
		d = 0
	}
	if h.Counts == nil {
		h.Counts = make(map[int]int64)
	}
	h.Counts[bucketOf(d)]++
	if h.N == 0 || int64(d) < h.MinNs {
		h.MinNs = int64(d)
	}
	h.N++
	h.SumNs += int64(d)
	if int64(d) > h.MaxNs {
		h.MaxNs = int64(d)
	}
}

func (h *Hist) merge(o *Hist) {
	if o == nil || o.N == 0 {
		return
	}
	if h.Counts == nil {
		h.Counts = make(map[int]int64)
	}
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
	if h.N == 0 || o.MinNs < h.MinNs {
		h.MinNs = o.MinNs
	}
	h.N += o.N
	h.SumNs += o.SumNs
	h.MaxNs = max(h.MaxNs, o.MaxNs)
}

// Quantile returns the q-quantile (0 < q ≤ 1): the upper bound of the bucket
// holding the ceil(q·N)-th smallest sample, clamped to [min, max].
func (h *Hist) Quantile(q float64) time.Duration {
	if h.N == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.N)))
	rank = min(max(rank, 1), h.N)
	idx := make([]int, 0, len(h.Counts))
	for i := range h.Counts {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var cum int64
	for _, i := range idx {
		cum += h.Counts[i]
		if cum >= rank {
			v := bucketUpper(i)
			return min(max(v, time.Duration(h.MinNs)), time.Duration(h.MaxNs))
		}
	}
	return time.Duration(h.MaxNs)
}

// stepStats are the outcomes and latencies of one step.
type stepStats struct {
	Outcomes map[string]int64 `json:"outcomes"`
	Latency  Hist             `json:"latency"`
}

// slot is one 100 ms interval of the run.
type slot struct {
	Requests int64            `json:"requests"`
	Outcomes map[string]int64 `json:"outcomes"` // "step outcome" → count
}

// orderRecord is one order the run obtained: a 202, or an order the
// shopper learnt of otherwise (a 409 naming it, the sale's order lookup
// after a lost answer, a 503 carrying its id).
type orderRecord struct {
	OrderID string `json:"orderId"`
	ItemID  int64  `json:"itemId"`
	Status  string `json:"status,omitempty"` // last status seen by the shopper
	// Via is the HTTP status that revealed it: 202 (acknowledged), 409,
	// 200 (GET of the sale's order) or 503. A later 202 naming the same
	// order upgrades it to 202.
	Via int `json:"via"`
	// Source, Gateway and AtUnixMs say how, from which gateway (base URL)
	// and when the order was first learnt of (for a 202: the 202).
	Source    string `json:"source,omitempty"`
	Gateway   string `json:"gateway,omitempty"`
	AtUnixMs  int64  `json:"atUnixMs,omitempty"`
	Cancelled bool   `json:"cancelled,omitempty"` // the shopper cancelled it itself
}

// Sources of an order in the ledger.
const (
	SourcePurchase202 = "purchase_202" // the purchase's 202: an acknowledged order
	SourcePurchase409 = "purchase_409" // a purchase answered 409 ALREADY_PURCHASED naming it
	SourceSaleOrder   = "sale_order"   // GET /api/flash-sales/sales/{id}/order after a lost answer
	SourcePurchase503 = "purchase_503" // a 503 carrying its id (the reservation may still land)
)

// acked reports a 202 for the order.
func (o orderRecord) acked() bool { return o.Via == 202 }

// partial is what one process measured; partials merge into a Report.
type partial struct {
	Steps  map[string]*stepStats   `json:"steps"`
	Slots  map[int]*slot           `json:"slots"`
	Orders map[int64][]orderRecord `json:"orders"` // userID → orders
	Marks  map[string]int64        `json:"marks"`  // first/last Unix ms of events
	Count  Counters                `json:"counters"`
	Errors []string                `json:"errors,omitempty"`
	// Server5xx counts 5xx answers by "route status" (a 503 as "route 503
	// with Retry-After" or "route 503 without Retry-After"); NetErrors
	// counts transport errors by "route outcome" (conn_refused, …).
	Server5xx map[string]int64 `json:"server5xx,omitempty"`
	NetErrors map[string]int64 `json:"netErrors,omitempty"`
	// AdmitMs and ReserveMs are the Unix ms of every admission token a
	// shopper received and of every 202.
	AdmitMs   []int64 `json:"admitMs,omitempty"`
	ReserveMs []int64 `json:"reserveMs,omitempty"`
}

func newPartial() *partial {
	return &partial{
		Steps:  make(map[string]*stepStats),
		Slots:  make(map[int]*slot),
		Orders: make(map[int64][]orderRecord),
		Marks:  make(map[string]int64),

		Server5xx: make(map[string]int64),
		NetErrors: make(map[string]int64),
	}
}

// Marks kept as first (min) or last (max) Unix ms.
const (
	markFirstSoldOut  = "firstSoldOut"
	markFirstAdmitted = "firstAdmitted"
	markLastAdmitted  = "lastAdmitted"
	markFirstReserved = "firstReserved"
	markLastReserved  = "lastReserved"
)

func markIsFirst(name string) bool { return name[:5] == "first" }

func (p *partial) mark(name string, ms int64) {
	old, ok := p.Marks[name]
	switch {
	case !ok:
		p.Marks[name] = ms
	case markIsFirst(name) && ms < old:
		p.Marks[name] = ms
	case !markIsFirst(name) && ms > old:
		p.Marks[name] = ms
	}
}

func (p *partial) merge(o *partial) {
	for name, s := range o.Steps {
		d := p.Steps[name]
		if d == nil {
			d = &stepStats{Outcomes: make(map[string]int64)}
			p.Steps[name] = d
		}
		for k, v := range s.Outcomes {
			d.Outcomes[k] += v
		}
		d.Latency.merge(&s.Latency)
	}
	for i, s := range o.Slots {
		d := p.Slots[i]
		if d == nil {
			d = &slot{Outcomes: make(map[string]int64)}
			p.Slots[i] = d
		}
		d.Requests += s.Requests
		for k, v := range s.Outcomes {
			d.Outcomes[k] += v
		}
	}
	for u, os := range o.Orders {
		p.Orders[u] = append(p.Orders[u], os...)
	}
	for k, v := range o.Marks {
		p.mark(k, v)
	}
	for k, v := range o.Server5xx {
		p.Server5xx[k] += v
	}
	for k, v := range o.NetErrors {
		p.NetErrors[k] += v
	}
	p.AdmitMs = append(p.AdmitMs, o.AdmitMs...)
	p.ReserveMs = append(p.ReserveMs, o.ReserveMs...)
	p.Count.add(o.Count)
	for _, e := range o.Errors {
		if len(p.Errors) < maxErrorSamples {
			p.Errors = append(p.Errors, e)
		}
	}
}

const maxErrorSamples = 20

// Counters are the live totals shown by the progress line.
type Counters struct {
	Joined   int64 `json:"joined"`
	Admitted int64 `json:"admitted"`
	Reserved int64 `json:"reserved"`
	SoldOut  int64 `json:"soldOut"`
	Paid     int64 `json:"paid"`
	Hostile  int64 `json:"hostile"`
	Errors   int64 `json:"errors"`
	Requests int64 `json:"requests"`
	Done     int64 `json:"done"` // shoppers finished
	// WaitingAtEnd: shoppers still waiting for a turn (or still trying
	// to buy) when the run stopped them, without an order and not told
	// SOLD_OUT or ENDED.
	WaitingAtEnd int64 `json:"waitingAtEnd"`
	Reconnects   int64 `json:"reconnects"`   // room connections lost or refused and tried again
	GatewayMoves int64 `json:"gatewayMoves"` // a shopper moved to another gateway after a transport error
	// PlacesLost: rejoins that found the shopper further back than
	// before (a larger position, or WAITING after an admission that had
	// not expired).
	PlacesLost int64 `json:"placesLost"`
	// Shadowed: shoppers whose token carries the shadow risk claim
	// (Config.ShadowShare); ShadowAdmitted: those of them that saw an
	// admission (must be 0).
	Shadowed       int64 `json:"shadowed,omitempty"`
	ShadowAdmitted int64 `json:"shadowAdmitted,omitempty"`
}

func (c *Counters) add(o Counters) {
	c.Joined += o.Joined
	c.Admitted += o.Admitted
	c.Reserved += o.Reserved
	c.SoldOut += o.SoldOut
	c.Paid += o.Paid
	c.Hostile += o.Hostile
	c.Errors += o.Errors
	c.Requests += o.Requests
	c.Done += o.Done
	c.WaitingAtEnd += o.WaitingAtEnd
	c.Reconnects += o.Reconnects
	c.GatewayMoves += o.GatewayMoves
	c.PlacesLost += o.PlacesLost
	c.Shadowed += o.Shadowed
	c.ShadowAdmitted += o.ShadowAdmitted
}

type liveCounters struct {
	joined, admitted, reserved, soldOut, paid, hostile, errors, requests, done atomic.Int64
	waitingAtEnd, reconnects, gatewayMoves, placesLost                         atomic.Int64
	shadowed, shadowAdmitted                                                   atomic.Int64
}

func (l *liveCounters) snapshot() Counters {
	return Counters{
		Joined: l.joined.Load(), Admitted: l.admitted.Load(), Reserved: l.reserved.Load(),
		SoldOut: l.soldOut.Load(), Paid: l.paid.Load(), Hostile: l.hostile.Load(),
		Errors: l.errors.Load(), Requests: l.requests.Load(), Done: l.done.Load(),
		WaitingAtEnd: l.waitingAtEnd.Load(), Reconnects: l.reconnects.Load(),
		GatewayMoves: l.gatewayMoves.Load(), PlacesLost: l.placesLost.Load(),
		Shadowed: l.shadowed.Load(), ShadowAdmitted: l.shadowAdmitted.Load(),
	}
}

// recorder collects observations from many goroutines of one process.
type recorder struct {
	epoch time.Time // timeseries zero
	live  liveCounters

	mu     sync.Mutex
	p      *partial
	remote Counters // final counters of merged worker results
}

// mergeRemote adds a worker's result.
func (r *recorder) mergeRemote(o *partial) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := o.Count
	o.Count = Counters{}
	r.p.merge(o)
	r.remote.add(c)
}

func newRecorder(epoch time.Time) *recorder {
	return &recorder{epoch: epoch, p: newPartial()}
}

// observe records one outcome of step that started at start and took lat.
// request says whether it was one HTTP request or WebSocket exchange (for
// the requests-per-slot series).
func (r *recorder) observe(step, outcome string, start time.Time, lat time.Duration, request bool) {
	end := start.Add(lat)
	i := int(end.Sub(r.epoch) / slotWidth)
	if i < 0 {
		i = 0
	}
	if request {
		r.live.requests.Add(1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.p.Steps[step]
	if s == nil {
		s = &stepStats{Outcomes: make(map[string]int64)}
		r.p.Steps[step] = s
	}
	s.Outcomes[outcome]++
	s.Latency.add(lat)
	sl := r.p.Slots[i]
	if sl == nil {
		sl = &slot{Outcomes: make(map[string]int64)}
		r.p.Slots[i] = sl
	}
	if request {
		sl.Requests++
	}
	sl.Outcomes[step+" "+outcome]++
}

func (r *recorder) mark(name string, t time.Time) {
	r.mu.Lock()
	r.p.mark(name, t.UnixMilli())
	r.mu.Unlock()
}

func (r *recorder) order(userID int64, o orderRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, have := range r.p.Orders[userID] {
		if have.OrderID == o.OrderID {
			h := &r.p.Orders[userID][i]
			if o.Status != "" {
				h.Status = o.Status
			}
			if o.ItemID != 0 {
				// The order's own item (from GET order) wins over the
				// item a 409 ALREADY_PURCHASED answered for.
				h.ItemID = o.ItemID
			}
			if o.acked() && !h.acked() {
				h.Via, h.Source, h.Gateway, h.AtUnixMs = o.Via, o.Source, o.Gateway, o.AtUnixMs
			}
			h.Cancelled = h.Cancelled || o.Cancelled
			return
		}
	}
	r.p.Orders[userID] = append(r.p.Orders[userID], o)
}

// response counts a 5xx answer or a transport error of route; errors
// of a request cut short by the run's own end (ctx) are not the server's.
func (r *recorder) response(ctx context.Context, route string, res apiResult, err error) {
	var key string
	var m func() map[string]int64
	switch {
	case err != nil:
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return
		}
		key, m = route+" "+errOutcome(err), func() map[string]int64 { return r.p.NetErrors }
	case res.Status >= 500:
		key, m = route+" "+strconv.Itoa(res.Status), func() map[string]int64 { return r.p.Server5xx }
		if res.Status == 503 {
			if res.HasRetryAfter {
				key += " with Retry-After"
			} else {
				key += " without Retry-After"
			}
		}
	default:
		return
	}
	r.mu.Lock()
	m()[key]++
	r.mu.Unlock()
}

// admission and reservation record the time of an admission token a
// shopper received and of a 202, for the report's timeline.
func (r *recorder) admission(t time.Time) {
	r.mu.Lock()
	r.p.AdmitMs = append(r.p.AdmitMs, t.UnixMilli())
	r.mu.Unlock()
}

func (r *recorder) reservation(t time.Time) {
	r.mu.Lock()
	r.p.ReserveMs = append(r.p.ReserveMs, t.UnixMilli())
	r.mu.Unlock()
}

func (r *recorder) errorf(s string) {
	r.live.errors.Add(1)
	r.mu.Lock()
	if len(r.p.Errors) < maxErrorSamples {
		r.p.Errors = append(r.p.Errors, s)
	}
	r.mu.Unlock()
}

// result returns a copy-free snapshot; call only after every goroutine ended.
func (r *recorder) result() *partial {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p.Count = r.live.snapshot()
	r.p.Count.add(r.remote)
	return r.p
}
