package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// Reconnect and retry delays follow the shop page's backoff
// (static/site/assets/backoff.js): full jitter between backoffMin and
// min(backoffCap, backoffBase·2^attempt). The cap is the page's 30 s cut
// to 5 s, so that a run shows a recovery within seconds of a fault
// rather than the page's patience.
const (
	backoffBase = 500 * time.Millisecond
	backoffCap  = 5 * time.Second
	backoffMin  = 100 * time.Millisecond
)

// backoff is one shopper's retry delays, drawn from its own stream.
type backoff struct {
	rng *rand.Rand
	n   int
}

func (s *shard) newBackoff(userID int64, salt uint64) *backoff {
	return &backoff{rng: s.draw(userID, salt)}
}

// next returns the delay before the next attempt and counts it.
func (b *backoff) next() time.Duration {
	ceil := min(backoffCap, backoffBase<<min(b.n, 8))
	b.n++
	return backoffMin + time.Duration(b.rng.Float64()*float64(ceil-backoffMin))
}

// reset starts over after a success.
func (b *backoff) reset() { b.n = 0 }

// moveGateway points the shopper at the next gateway of the run (a no-op
// with one): its own failed with a transport error.
func (s *shard) moveGateway(sh *shopper) {
	n := len(s.cl.bases)
	if n < 2 {
		return
	}
	sh.gw = (sh.gw + 1) % n
	sh.base = s.cl.bases[sh.gw]
	s.rec.live.gatewayMoves.Add(1)
}

// call sends one API request of the shopper to its gateway, counts a 5xx
// or transport error under route, and moves the shopper to the next
// gateway after a transport error.
func (s *shard) call(ctx context.Context, sh *shopper, route, method, path string, hdr map[string]string, body any) (apiResult, error) {
	r, err := do(ctx, sh.hc, method, s.absURL(sh, path), hdr, body)
	s.rec.response(ctx, sh.prefix+route, r, err)
	if err != nil && ctx.Err() == nil && gatewayGone(err) {
		s.moveGateway(sh)
	}
	return r, err
}

// maxBuyAttempts bounds one admission's purchase requests and order
// lookups, but for a holder's while its unit is held (the page keeps its
// buy button for the whole window); ctx bounds their time.
const maxBuyAttempts = 40

// buy tries the admitted items (starting at firstItem) until a
// reservation, an error, or every item sold out. A purchase whose answer
// was lost (a transport error, a 5xx, a 503 naming an order) may have
// reserved: before buying again the shopper looks its order up with
// GET /api/flash-sales/sales/{id}/order, as the shop page does, and an
// order found there is its order.
func (s *shard) buy(ctx context.Context, sh *shopper, m *roomMsg) (buyResult, orderRecord) {
	n := len(m.Items)
	if n == 0 {
		s.rec.errorf("admitted without items")
		return buyFailed, orderRecord{}
	}
	hdr := map[string]string{"Authorization": "Bearer " + sh.tok, "X-Admission-Token": m.AdmissionToken}
	first := s.firstItem(sh.userID, n)
	bo := s.newBackoff(sh.userID, 0x6a09e667f3bcc908)
	uncertain := false // an earlier answer was lost: the purchase may have reserved
	attempts := 0
	for k := range n {
		it := m.Items[(first+k)%n]
		if at, ok := s.soldOut.Load(it.PurchaseURL); ok && !uncertain && time.Since(time.Unix(0, at.(int64))) < soldOutFresh {
			continue
		}
		for {
			if ctx.Err() != nil || attempts >= maxBuyAttempts && time.Now().UnixMilli() >= m.HoldUntilMs {
				return buyFailed, orderRecord{}
			}
			attempts++
			if uncertain {
				o, found, ok := s.lookupOrder(ctx, sh)
				switch {
				case found:
					return buyBought, o
				case !ok:
					if !sleepCtx(ctx, bo.next()) {
						return buyFailed, orderRecord{}
					}
					continue
				}
				uncertain = false
				continue
			}
			base := sh.base
			t0 := time.Now()
			r, err := s.call(ctx, sh, StepPurchase, http.MethodPost, it.PurchaseURL, hdr, nil)
			if err != nil {
				s.rec.observe(s.step(sh, StepPurchase), errOutcome(err), t0, time.Since(t0), true)
				if ctx.Err() != nil {
					return buyFailed, orderRecord{}
				}
				uncertain = true
				if !sleepCtx(ctx, bo.next()) {
					return buyFailed, orderRecord{}
				}
				continue
			}
			s.rec.observe(s.step(sh, StepPurchase), r.outcome(), t0, time.Since(t0), true)
			var b struct {
				OrderID string `json:"orderId"`
			}
			json.Unmarshal(r.Body, &b)
			switch {
			case r.Status == http.StatusAccepted || (r.Status == http.StatusConflict && r.Code == "ALREADY_PURCHASED"):
				if b.OrderID == "" {
					s.rec.errorf(fmt.Sprintf("purchase %d without orderId", r.Status))
					return buyFailed, orderRecord{}
				}
				now := time.Now()
				o := orderRecord{OrderID: b.OrderID, ItemID: it.ID, Status: "PENDING", Via: r.Status,
					Source: SourcePurchase409, Gateway: base, AtUnixMs: now.UnixMilli()}
				if it.ID == 0 {
					o.ItemID = itemFromURL(it.PurchaseURL)
				}
				if r.Status == http.StatusAccepted {
					o.Source = SourcePurchase202
					s.rec.live.reserved.Add(1)
					s.rec.mark(markFirstReserved, now)
					s.rec.mark(markLastReserved, now)
					s.rec.reservation(now)
				}
				s.rec.order(sh.userID, o)
				return buyBought, o
			case r.Status == http.StatusGone:
				// this item is sold out: try the next
				s.soldOut.Store(it.PurchaseURL, time.Now().UnixNano())
			case r.Status == http.StatusForbidden && r.Code == "NOT_ADMITTED":
				return buyNotAdmitted, orderRecord{}
			case r.Status == http.StatusTooManyRequests || r.Status >= 500:
				if r.Status == http.StatusServiceUnavailable && b.OrderID != "" {
					// The reservation was made but its record may not
					// have reached the broker: it may still land.
					s.rec.order(sh.userID, orderRecord{OrderID: b.OrderID, ItemID: it.ID, Status: "PENDING", Via: r.Status,
						Source: SourcePurchase503, Gateway: base, AtUnixMs: time.Now().UnixMilli()})
				}
				// A 503 without an order id reserved nothing (CONTRACT
				// section 5); any other 5xx may have. After a 503 naming
				// an order the shopper buys again after Retry-After, as
				// the page does: the gateway that made the order answers
				// 202 once it is confirmed, buys anew once it was
				// refused, and answers 503 again until then; another
				// gateway answers ALREADY_PURCHASED with it.
				uncertain = r.Status >= 500 && r.Status != http.StatusServiceUnavailable
				d := retryDelay(r)
				if !r.HasRetryAfter {
					d = bo.next()
				}
				if !sleepCtx(ctx, d) {
					return buyFailed, orderRecord{}
				}
				continue
			default:
				return buyFailed, orderRecord{}
			}
			break
		}
	}
	if uncertain {
		// The last answer was lost and every other item is sold out:
		// the lost one may still have reserved.
		if o, found, _ := s.lookupOrder(ctx, sh); found {
			return buyBought, o
		}
	}
	return buySoldOut, orderRecord{}
}

// lookupOrder asks for the shopper's order in the sale: found with the
// order, not found (404 or an order no longer live), or !ok when the
// answer did not come.
func (s *shard) lookupOrder(ctx context.Context, sh *shopper) (o orderRecord, found, ok bool) {
	base := sh.base
	t0 := time.Now()
	r, err := s.call(ctx, sh, StepSaleOrder, http.MethodGet, fmt.Sprintf("/api/flash-sales/sales/%d/order", s.sale.ID), bearer(sh.tok), nil)
	if err != nil {
		s.rec.observe(s.step(sh, StepSaleOrder), errOutcome(err), t0, time.Since(t0), true)
		return orderRecord{}, false, false
	}
	s.rec.observe(s.step(sh, StepSaleOrder), r.outcome(), t0, time.Since(t0), true)
	switch r.Status {
	case http.StatusOK:
	case http.StatusNotFound:
		return orderRecord{}, false, true
	default:
		return orderRecord{}, false, false
	}
	var b struct {
		OrderID string `json:"orderId"`
		ItemID  int64  `json:"itemId"`
		Status  string `json:"status"`
	}
	if json.Unmarshal(r.Body, &b) != nil || b.OrderID == "" {
		return orderRecord{}, false, false
	}
	o = orderRecord{OrderID: b.OrderID, ItemID: b.ItemID, Status: b.Status, Via: http.StatusOK,
		Source: SourceSaleOrder, Gateway: base, AtUnixMs: time.Now().UnixMilli()}
	s.rec.order(sh.userID, o)
	if !live(b.Status) {
		return orderRecord{}, false, true
	}
	return o, true, true
}

// Order polling as the shopper page does it (static/site/assets/app.js,
// showOrder and pollOrder): orderPollEvery after a 202 (at once after a 409,
// which names an older order), then every orderPollEvery until payable;
// after a 429 or 5xx, the Retry-After or orderPollBusy; after a transport
// error, the backoff (on the next gateway). A winner follows its order
// for followFor at most before giving up on paying.
const (
	orderPollEvery = time.Second
	orderPollBusy  = 3 * time.Second
	followFor      = time.Minute
	orderMisses    = 15
)

// afterOrder waits for the order to become payable, then pays (or not).
func (s *shard) afterOrder(ctx context.Context, sh *shopper, o orderRecord) {
	t0 := time.Now()
	path := "/api/flash-sales/orders/" + o.OrderID
	deadline := t0.Add(followFor)
	bo := s.newBackoff(sh.userID, 0xbb67ae8584caa73b)
	payable := false
	misses := 0
	if o.Via == http.StatusAccepted && !sleepCtx(ctx, orderPollEvery) {
		s.rec.observe(s.step(sh, StepPayable), "canceled", t0, time.Since(t0), false)
		return
	}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t := time.Now()
		r, err := s.call(ctx, sh, StepOrderGet, http.MethodGet, path, bearer(sh.tok), nil)
		if err != nil {
			s.rec.observe(s.step(sh, StepOrderGet), errOutcome(err), t, time.Since(t), true)
			if !sleepCtx(ctx, bo.next()) {
				break
			}
			continue
		}
		s.rec.observe(s.step(sh, StepOrderGet), r.outcome(), t, time.Since(t), true)
		delay := orderPollEvery
		if r.busy() || r.Status >= 500 {
			delay = orderPollBusy
			if r.RetryAfter > 0 {
				delay = min(r.RetryAfter, backoffCap)
			}
		}
		if r.Status == http.StatusNotFound {
			// Just reserved, the order may take a moment to be visible;
			// the page gives up after orderMisses of them.
			if misses++; misses > orderMisses {
				s.rec.observe(s.step(sh, StepPayable), "not_found", t0, time.Since(t0), false)
				return
			}
		}
		if r.Status == http.StatusOK {
			misses = 0
			bo.reset()
			var b struct {
				Status  string `json:"status"`
				Payable bool   `json:"payable"`
				ItemID  int64  `json:"itemId"`
			}
			if json.Unmarshal(r.Body, &b) == nil {
				if b.ItemID != 0 && b.ItemID != o.ItemID {
					// A 409 ALREADY_PURCHASED names the order, not its
					// item: the user may hold it on another item (a
					// reservation whose 202 was lost, then a retry on the
					// next item). Record the order's real item.
					o.ItemID = b.ItemID
					s.rec.order(sh.userID, o)
				}
				if b.Status != "" && b.Status != "PENDING" {
					o.Status = b.Status
					s.rec.order(sh.userID, o)
					s.rec.observe(s.step(sh, StepPayable), "status "+b.Status, t0, time.Since(t0), false)
					return
				}
				if b.Payable {
					payable = true
					break
				}
			}
		}
		if !sleepCtx(ctx, delay) {
			break
		}
	}
	if !payable {
		out := "timeout"
		if ctx.Err() != nil {
			out = "canceled"
		}
		s.rec.observe(s.step(sh, StepPayable), out, t0, time.Since(t0), false)
		return
	}
	s.rec.observe(s.step(sh, StepPayable), "payable", t0, time.Since(t0), false)
	if !s.pays(sh.userID) {
		return
	}
	if d := s.payAfter(sh.userID); d > 0 && !sleepCtx(ctx, d) {
		return
	}
	// Paying is tried again while the order is not payable yet or the
	// answer did not come, for followFor: a database outage of tens of
	// seconds answers 503 meanwhile.
	payUntil := time.Now().Add(followFor)
	for time.Now().Before(payUntil) && ctx.Err() == nil {
		t := time.Now()
		r, err := s.call(ctx, sh, StepPay, http.MethodPost, path+"/pay", bearer(sh.tok), map[string]string{"paymentToken": "loadtest"})
		if err != nil {
			s.rec.observe(s.step(sh, StepPay), errOutcome(err), t, time.Since(t), true)
			if !sleepCtx(ctx, bo.next()) {
				return
			}
			continue
		}
		s.rec.observe(s.step(sh, StepPay), r.outcome(), t, time.Since(t), true)
		switch {
		case r.Status == http.StatusOK:
			o.Status = "PAID"
			s.rec.order(sh.userID, o)
			s.rec.live.paid.Add(1)
			return
		case r.Code == "ORDER_EXPIRED":
			o.Status = "EXPIRED"
			s.rec.order(sh.userID, o)
			return
		case r.Code == "ORDER_CANCELLED":
			o.Status = "CANCELLED"
			s.rec.order(sh.userID, o)
			return
		case r.Code == "NOT_PAYABLE_YET" || r.busy() || r.Status >= 500:
			d := max(retryDelay(r), 200*time.Millisecond)
			if r.Status >= 500 && !r.HasRetryAfter {
				d = bo.next()
			}
			if !sleepCtx(ctx, d) {
				return
			}
		default:
			return
		}
	}
}
