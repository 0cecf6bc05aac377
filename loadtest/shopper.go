package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	gojson "github.com/goccy/go-json"

	"github.com/flashsale/flashsale/auth"
)

// Steps of the report.
const (
	StepJoin         = "join"          // connect + join → first answer of the room
	StepAdmittedWait = "admitted_wait" // from opening (or join, if later) to admitted / SOLD_OUT
	StepPoll         = "poll"          // polling transport: each GET of the status
	StepPow          = "pow"           // proof-of-work challenges met
	StepPurchase     = "purchase"      // each purchase request
	StepOrderGet     = "order_get"     // each GET of the order
	StepPayable      = "order_payable" // from the 202 until the order is payable
	StepPay          = "pay"           // each pay request
	StepPreconnect   = "preconnect"    // Config.Preconnect: each warming GET of the sale view
	StepFlood        = "hostile_flood" // purchases without valid tokens
	StepEarly        = "hostile_early" // purchases before opening
	oneAddrPrefix    = "hostile_oneaddr_"
)

// saleInfo is what shoppers need to know about the sale.
type saleInfo struct {
	ID      int64      `json:"id"`
	OpensAt time.Time  `json:"opensAt"`
	Items   []itemInfo `json:"items"`
}

type itemInfo struct {
	ID       int64 `json:"id"`
	Quantity int64 `json:"quantity"`
}

// shard runs a share of the shoppers in one process.
type shard struct {
	cfg   Config
	sale  saleInfo
	cl    *clients
	rec   *recorder
	solve func(json.RawMessage) (json.RawMessage, error)
	ttl   time.Duration // access-token lifetime
	// soldOut is when this process last saw each item answer 410 (purchase URL
	// → Unix ns). Shoppers skip an item seen sold out in the last
	// soldOutFresh, as a page shows the sold-out badges of the public sale
	// view (cached 1 s) instead of letting every shopper click them.
	soldOut sync.Map
}

// soldOutFresh is how long a 410 seen by one shopper keeps the others of
// the process from trying that item.
const soldOutFresh = time.Second

// shopper is one simulated user.
type shopper struct {
	idx    int // global index: picks source address and gateway
	userID int64
	prefix string // step-name prefix ("" or oneAddrPrefix)
	hc     *httpClient
	base   string
	tok    string
}

func (s *shard) step(sh *shopper, name string) string { return sh.prefix + name }

// roomMsg is any waiting-room message (WebSocket) or status object (polling).
type roomMsg struct {
	Type           string      `json:"type"`
	State          string      `json:"state"`
	Error          string      `json:"error"`
	OpensAtMs      int64       `json:"opensAtMs"`
	AdmissionToken string      `json:"admissionToken"`
	Items          []roomItem  `json:"items"`
	Position       json.Number `json:"position"`
}

// decodeRoomMsg decodes a room message with goccy/go-json: 3 µs for an
// admitted message against encoding/json's 18 µs (0.5 against 2.7 µs for a
// status), measured here. At a drop's opening the tool decodes ten
// thousand admissions within a second, on the cores the gateways need:
// with encoding/json that was a third of its CPU.
func decodeRoomMsg(b []byte, m *roomMsg) error { return gojson.Unmarshal(b, m) }

type roomItem struct {
	ID          int64  `json:"id"`
	PurchaseURL string `json:"purchaseUrl"`
}

type buyResult int

const (
	buyFailed buyResult = iota
	buySoldOut
	buyBought
)

// wait tracks one shopper's time in the room.
type wait struct {
	joined    bool
	start     time.Time // join start
	waitFrom  time.Time // max(join, opening)
	soldOut   bool
	counted   bool // in the sold-out counter
	admitted  bool
	lastAdm   *roomMsg
	order     *orderRecord // bought: the order to follow up after leaving the room
	opensAtMs int64
}

func (s *shard) waitFrom(w *wait, now time.Time) time.Time {
	open := s.sale.OpensAt
	if w.opensAtMs > 0 {
		open = time.UnixMilli(w.opensAtMs)
	}
	if now.After(open) {
		return now
	}
	return open
}

// joinedNow records the first answer of the room.
func (s *shard) joinedNow(sh *shopper, w *wait, outcome string) {
	if w.joined {
		return
	}
	now := time.Now()
	w.joined = true
	w.waitFrom = s.waitFrom(w, w.start)
	s.rec.observe(s.step(sh, StepJoin), outcome, w.start, now.Sub(w.start), true)
	s.rec.live.joined.Add(1)
}

func (s *shard) soldOutNow(sh *shopper, w *wait) {
	if w.soldOut {
		return
	}
	now := time.Now()
	w.soldOut = true
	if !w.admitted {
		// The wait ended in SOLD_OUT; an admitted shopper's wait already
		// ended in ADMITTED (its 410 is in the purchase step).
		s.rec.observe(s.step(sh, StepAdmittedWait), "SOLD_OUT", w.waitFrom, max(now.Sub(w.waitFrom), 0), false)
	}
	s.rec.mark(markFirstSoldOut, now)
	if !w.counted {
		w.counted = true
		s.rec.live.soldOut.Add(1)
	}
}

func (s *shard) admittedNow(sh *shopper, w *wait) {
	now := time.Now()
	if !w.admitted {
		s.rec.observe(s.step(sh, StepAdmittedWait), "ADMITTED", w.waitFrom, max(now.Sub(w.waitFrom), 0), false)
		s.rec.live.admitted.Add(1)
	}
	w.admitted = true
	s.rec.mark(markFirstAdmitted, now)
	s.rec.mark(markLastAdmitted, now)
}

// run is one shopper's whole life, bounded by ctx.
func (s *shard) run(ctx context.Context, sh *shopper) {
	defer s.rec.live.done.Add(1)
	tok, err := auth.Mint(s.cfg.JWTSecret, sh.userID, false, s.ttl, time.Now())
	if err != nil {
		s.rec.errorf(err.Error())
		return
	}
	sh.tok = tok
	if s.cfg.Transport == TransportPolling {
		s.runPolling(ctx, sh)
		return
	}
	s.runWS(ctx, sh)
}

func (s *shard) runWS(ctx context.Context, sh *shopper) {
	w := &wait{start: time.Now()}
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	conn, resp, err := websocket.Dial(dctx, wsURL(sh.base)+queuePath(s.sale.ID), &websocket.DialOptions{HTTPClient: sh.hc.ws})
	cancel()
	if err != nil {
		out := "ws_" + errOutcome(err)
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			out = fmt.Sprintf("ws_%d", resp.StatusCode)
		}
		s.rec.observe(s.step(sh, StepJoin), out, w.start, time.Since(w.start), true)
		if ctx.Err() == nil {
			s.rec.errorf("ws dial: " + err.Error())
		}
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 16)
	if err := writeJSON(ctx, conn, map[string]any{"type": "join", "accessToken": sh.tok}); err != nil {
		s.rec.observe(s.step(sh, StepJoin), "ws_"+errOutcome(err), w.start, time.Since(w.start), true)
		return
	}
	for {
		data, err := readMessage(ctx, conn)
		if err != nil {
			out := "ws_" + errOutcome(err)
			if cs := websocket.CloseStatus(err); cs != -1 {
				out = fmt.Sprintf("ws_close_%d", cs)
			}
			switch {
			case !w.joined:
				s.rec.observe(s.step(sh, StepJoin), out, w.start, time.Since(w.start), true)
			case !w.admitted && !w.soldOut:
				s.rec.observe(s.step(sh, StepAdmittedWait), out, w.waitFrom, max(time.Since(w.waitFrom), 0), false)
			}
			return
		}
		var m roomMsg
		err = decodeRoomMsg(data.Bytes(), &m)
		var challenge []byte
		if m.Type == "challenge" {
			challenge = bytes.Clone(data.Bytes())
		}
		msgBufs.Put(data)
		if err != nil {
			s.rec.errorf("room message: " + err.Error())
			return
		}
		if m.OpensAtMs > 0 {
			w.opensAtMs = m.OpensAtMs
		}
		switch m.Type {
		case "challenge":
			pow, ok := s.solvePow(sh, challenge)
			if !ok {
				return
			}
			if err := writeJSON(ctx, conn, map[string]any{"type": "join", "accessToken": sh.tok, "pow": pow}); err != nil {
				return
			}
		case "error":
			if !w.joined {
				s.joinedNow(sh, w, "error "+m.Error)
			} else {
				s.rec.observe(s.step(sh, StepAdmittedWait), "error "+m.Error, w.waitFrom, max(time.Since(w.waitFrom), 0), false)
			}
			return
		case "status":
			s.joinedNow(sh, w, m.State)
			switch m.State {
			case "SOLD_OUT":
				s.soldOutNow(sh, w)
				if !s.cfg.KeepWaiting {
					s.linger(ctx, sh, conn)
					return
				}
			case "ENDED":
				if !w.admitted && !w.soldOut {
					s.rec.observe(s.step(sh, StepAdmittedWait), "ENDED", w.waitFrom, max(time.Since(w.waitFrom), 0), false)
				}
				return
			case "ADMITTED":
				// Stock came back after a sold-out while this shopper
				// still holds a valid admission: buy again.
				if w.soldOut && w.lastAdm != nil {
					w.soldOut = false
					if done := s.admittedBuy(ctx, sh, w, w.lastAdm); done {
						s.leave(ctx, sh, w, conn)
						return
					}
				}
			}
		case "admitted":
			s.joinedNow(sh, w, "ADMITTED")
			w.soldOut = false
			if done := s.admittedBuy(ctx, sh, w, &m); done {
				s.leave(ctx, sh, w, conn)
				return
			}
		}
	}
}

// linger keeps a shopper who saw SOLD_OUT connected, its room read (pings
// answered, messages dropped), for lingerFor, then leaves; at the run's
// end (ctx) it drops the connection without a close handshake.
func (s *shard) linger(ctx context.Context, sh *shopper, conn *websocket.Conn) {
	if d := s.lingerFor(sh.userID); d > 0 {
		t := time.AfterFunc(d, func() { conn.Close(websocket.StatusNormalClosure, "") })
		defer t.Stop()
		for {
			b, err := readMessage(ctx, conn)
			if err != nil {
				break // closed by the timer, the server, or ctx
			}
			msgBufs.Put(b)
		}
		if ctx.Err() != nil {
			conn.CloseNow()
			return
		}
	}
	conn.Close(websocket.StatusNormalClosure, "") // a no-op when already closed
}

// admittedBuy buys after an admission; it reports whether the shopper is
// done in the room (bought: w.order is set; failed; or sold out without
// KeepWaiting).
func (s *shard) admittedBuy(ctx context.Context, sh *shopper, w *wait, m *roomMsg) bool {
	s.admittedNow(sh, w)
	w.lastAdm = m
	res, o := s.buy(ctx, sh, m)
	switch res {
	case buyBought:
		w.order = &o
		return true
	case buySoldOut:
		s.soldOutNow(sh, w)
		return !s.cfg.KeepWaiting
	default:
		return true
	}
}

// leave ends a shopper's time in the room after its purchase attempt: one
// that bought stays (stayWhileFollowing); one that lost or failed leaves.
func (s *shard) leave(ctx context.Context, sh *shopper, w *wait, conn *websocket.Conn) {
	if w.order == nil {
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	s.stayWhileFollowing(ctx, sh, *w.order, conn)
}

// stayWhileFollowing follows up a bought order while the shopper stays in
// the room, as the shop page does (it keeps its WebSocket open after a
// purchase): the room is read meanwhile (its pings answered, its statuses
// dropped) and left when the follow-up ends, or at SOLD_OUT or ENDED unless
// KeepWaiting. Leaving at once, as the tool did, put every winner's close
// handshake into the busiest seconds of the sale.
func (s *shard) stayWhileFollowing(ctx context.Context, sh *shopper, o orderRecord, conn *websocket.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.afterOrder(ctx, sh, o)
		conn.Close(websocket.StatusNormalClosure, "") // a no-op when already closed
	}()
	defer func() { <-done }()
	for {
		b, err := readMessage(ctx, conn)
		if err != nil {
			return // closed by the follow-up, the server, or ctx
		}
		var m roomMsg
		err = decodeRoomMsg(b.Bytes(), &m)
		msgBufs.Put(b)
		if err == nil && m.Type == "status" && (m.State == "SOLD_OUT" || m.State == "ENDED") && !s.cfg.KeepWaiting {
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

func (s *shard) solvePow(sh *shopper, challenge []byte) (json.RawMessage, bool) {
	t0 := time.Now()
	if s.solve == nil {
		s.rec.observe(s.step(sh, StepPow), "no_solver", t0, 0, false)
		return nil, false
	}
	pow, err := s.solve(json.RawMessage(challenge))
	if err != nil {
		s.rec.observe(s.step(sh, StepPow), "solve_error", t0, time.Since(t0), false)
		s.rec.errorf("pow: " + err.Error())
		return nil, false
	}
	s.rec.observe(s.step(sh, StepPow), "solved", t0, time.Since(t0), false)
	return pow, true
}

// msgBufs holds the buffers room messages are read into: a shopper reads
// a message every few seconds, and reading each into a fresh, growing slice
// (websocket.Conn.Read) made the load tool's allocations and page faults a
// tenth of its CPU at the opening of a 100,000-shopper drop.
var msgBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readMessage reads one message into a buffer of msgBufs; the caller puts
// it back.
func readMessage(ctx context.Context, c *websocket.Conn) (*bytes.Buffer, error) {
	_, r, err := c.Reader(ctx)
	if err != nil {
		return nil, err
	}
	b := msgBufs.Get().(*bytes.Buffer)
	b.Reset()
	if _, err := b.ReadFrom(r); err != nil {
		msgBufs.Put(b)
		return nil, err
	}
	return b, nil
}

func writeJSON(ctx context.Context, c *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, b)
}

func (s *shard) runPolling(ctx context.Context, sh *shopper) {
	w := &wait{start: time.Now()}
	url := sh.base + queuePath(s.sale.ID)
	var body any
	var m roomMsg
	for attempt := 0; ; attempt++ {
		r, err := do(ctx, sh.hc, http.MethodPost, url, bearer(sh.tok), body)
		if err != nil {
			s.rec.observe(s.step(sh, StepJoin), errOutcome(err), w.start, time.Since(w.start), true)
			return
		}
		var c struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(r.Body, &c) == nil && c.Type == "challenge" {
			// The answer body is the challenge, whatever its status
			// (defense/POW.md); the next POST carries the solution.
			s.rec.observe(s.step(sh, StepPoll), "challenge", w.start, time.Since(w.start), true)
			pow, ok := s.solvePow(sh, r.Body)
			if !ok || attempt > 3 {
				return
			}
			body = map[string]any{"pow": pow}
			continue
		}
		if r.Status == http.StatusOK {
			if json.Unmarshal(r.Body, &m) != nil {
				s.rec.observe(s.step(sh, StepJoin), "bad_body", w.start, time.Since(w.start), true)
				return
			}
			break
		}
		if r.busy() && attempt < 3 {
			s.rec.observe(s.step(sh, StepPoll), r.outcome(), w.start, time.Since(w.start), true)
			if !sleepCtx(ctx, retryDelay(r)) {
				return
			}
			continue
		}
		s.joinedNow(sh, w, r.outcome())
		return
	}
	s.joinedNow(sh, w, m.State)
	interval := s.cfg.PollInterval
	rng := s.draw(sh.userID, 0)
	for ctx.Err() == nil {
		if m.OpensAtMs > 0 {
			w.opensAtMs = m.OpensAtMs
		}
		switch m.State {
		case "ADMITTED":
			if m.AdmissionToken != "" && len(m.Items) > 0 {
				adm := m
				if done := s.admittedBuy(ctx, sh, w, &adm); done {
					if w.order != nil {
						s.afterOrder(ctx, sh, *w.order)
					}
					return
				}
			}
		case "SOLD_OUT":
			s.soldOutNow(sh, w)
			if !s.cfg.KeepWaiting {
				return
			}
		case "ENDED":
			if !w.admitted && !w.soldOut {
				s.rec.observe(s.step(sh, StepAdmittedWait), "ENDED", w.waitFrom, max(time.Since(w.waitFrom), 0), false)
			}
			return
		}
		// ±20% jitter so pollers do not march in step.
		d := time.Duration(float64(interval) * (0.8 + 0.4*rng.Float64()))
		if w.soldOut {
			d *= 2
		}
		if !sleepCtx(ctx, d) {
			break
		}
		t0 := time.Now()
		r, err := do(ctx, sh.hc, http.MethodGet, url, bearer(sh.tok), nil)
		if err != nil {
			s.rec.observe(s.step(sh, StepPoll), errOutcome(err), t0, time.Since(t0), true)
			if ctx.Err() == nil {
				continue
			}
			break
		}
		s.rec.observe(s.step(sh, StepPoll), r.outcome(), t0, time.Since(t0), true)
		if r.Status != http.StatusOK {
			if r.RetryAfter > 0 && !sleepCtx(ctx, retryDelay(r)) {
				break
			}
			continue
		}
		m = roomMsg{}
		if json.Unmarshal(r.Body, &m) != nil {
			s.rec.errorf("poll: undecodable status")
			return
		}
	}
	if !w.admitted && !w.soldOut {
		s.rec.observe(s.step(sh, StepAdmittedWait), "canceled", w.waitFrom, max(time.Since(w.waitFrom), 0), false)
	}
}

func retryDelay(r apiResult) time.Duration {
	return min(max(r.RetryAfter, 100*time.Millisecond), 2*time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (s *shard) absURL(sh *shopper, path string) string {
	if strings.HasPrefix(path, "http://") || strings.HasPrefix(path, "https://") {
		return path
	}
	return sh.base + path
}

// buy tries the admitted items (starting at firstItem) until a
// reservation, an error, or every item sold out.
func (s *shard) buy(ctx context.Context, sh *shopper, m *roomMsg) (buyResult, orderRecord) {
	n := len(m.Items)
	if n == 0 {
		s.rec.errorf("admitted without items")
		return buyFailed, orderRecord{}
	}
	hdr := map[string]string{"Authorization": "Bearer " + sh.tok, "X-Admission-Token": m.AdmissionToken}
	first := s.firstItem(sh.userID, n)
	for k := range n {
		it := m.Items[(first+k)%n]
		if at, ok := s.soldOut.Load(it.PurchaseURL); ok && time.Since(time.Unix(0, at.(int64))) < soldOutFresh {
			continue
		}
		for attempt := 0; ; attempt++ {
			if ctx.Err() != nil {
				return buyFailed, orderRecord{}
			}
			t0 := time.Now()
			r, err := do(ctx, sh.hc, http.MethodPost, s.absURL(sh, it.PurchaseURL), hdr, nil)
			if err != nil {
				s.rec.observe(s.step(sh, StepPurchase), errOutcome(err), t0, time.Since(t0), true)
				if ctx.Err() == nil {
					s.rec.errorf("purchase: " + err.Error())
				}
				return buyFailed, orderRecord{}
			}
			s.rec.observe(s.step(sh, StepPurchase), r.outcome(), t0, time.Since(t0), true)
			switch {
			case r.Status == http.StatusAccepted || (r.Status == http.StatusConflict && r.Code == "ALREADY_PURCHASED"):
				var b struct {
					OrderID string `json:"orderId"`
				}
				if json.Unmarshal(r.Body, &b) != nil || b.OrderID == "" {
					s.rec.errorf(fmt.Sprintf("purchase %d without orderId", r.Status))
					return buyFailed, orderRecord{}
				}
				o := orderRecord{OrderID: b.OrderID, ItemID: it.ID, Status: "PENDING", Via: r.Status}
				if it.ID == 0 {
					o.ItemID = itemFromURL(it.PurchaseURL)
				}
				s.rec.order(sh.userID, o)
				if r.Status == http.StatusAccepted {
					now := time.Now()
					s.rec.live.reserved.Add(1)
					s.rec.mark(markFirstReserved, now)
					s.rec.mark(markLastReserved, now)
				}
				return buyBought, o
			case r.Status == http.StatusGone:
				// this item is sold out: try the next
				s.soldOut.Store(it.PurchaseURL, time.Now().UnixNano())
			case r.busy() && attempt < 3:
				if !sleepCtx(ctx, retryDelay(r)) {
					return buyFailed, orderRecord{}
				}
				continue
			default:
				return buyFailed, orderRecord{}
			}
			break
		}
	}
	return buySoldOut, orderRecord{}
}

func itemFromURL(u string) int64 {
	var id int64
	if i := strings.Index(u, "/items/"); i >= 0 {
		fmt.Sscanf(u[i+len("/items/"):], "%d", &id)
	}
	return id
}

// draw is a shopper's own random stream for one purpose (salt): fixed by
// the run's seed and the user id, so a run with the same seed repeats
// every shopper's choices whichever process and gateway serve it.
func (s *shard) draw(userID int64, salt uint64) *rand.Rand {
	return rand.New(rand.NewPCG(s.cfg.Seed^salt, uint64(userID)))
}

// firstItem draws, from the seed and the user id, the first of n items a
// shopper tries. It was the user id modulo n, and a shopper's gateway is
// its index modulo the gateways: with 10 items over 6 gateways the odd
// items were all tried first through the odd gateways, so whichever half
// of the gateways ran slower sold its five items later (the 10,000-unit
// drop of 2026-11-30: median reservation 0.82 s against 1.06 s after
// opening by item parity).
func (s *shard) firstItem(userID int64, n int) int {
	return s.draw(userID, 0xd1b54a32d192ed03).IntN(n)
}

// pays draws, from the seed and the user id, whether this winner pays.
func (s *shard) pays(userID int64) bool {
	if s.cfg.PayFraction >= 1 {
		return true
	}
	return s.draw(userID, 0x9e3779b97f4a7c15).Float64() < s.cfg.PayFraction
}

// payAfter draws, from the seed and the user id, this winner's think time
// before paying: 50–150% of PayAfter.
func (s *shard) payAfter(userID int64) time.Duration {
	return s.around(s.cfg.PayAfter, userID, 0x5851f42d4c957f2d)
}

// lingerFor draws, from the seed and the user id, how long this loser
// stays on the sold-out page: 50–150% of Linger.
func (s *shard) lingerFor(userID int64) time.Duration {
	return s.around(s.cfg.Linger, userID, 0x2545f4914f6cdd1d)
}

// around is 50–150% of d, drawn from the seed, salt and the user id.
func (s *shard) around(d time.Duration, userID int64, salt uint64) time.Duration {
	if d <= 0 {
		return 0
	}
	f := s.draw(userID, salt).Float64()
	return time.Duration(float64(d) * (0.5 + f))
}

// Order polling as the shopper page does it (static/site/assets/app.js,
// showOrder and pollOrder): orderPollEvery after a 202 (at once after a 409,
// which names an older order), then every orderPollEvery until payable;
// after a 429 or 503, the Retry-After or orderPollBusy.
const (
	orderPollEvery = time.Second
	orderPollBusy  = 3 * time.Second
)

// afterOrder waits for the order to become payable, then pays (or not).
func (s *shard) afterOrder(ctx context.Context, sh *shopper, o orderRecord) {
	t0 := time.Now()
	url := sh.base + "/api/flash-sales/orders/" + o.OrderID
	deadline := t0.Add(requestTimeout)
	payable := false
	if o.Via == http.StatusAccepted && !sleepCtx(ctx, orderPollEvery) {
		s.rec.observe(s.step(sh, StepPayable), "canceled", t0, time.Since(t0), false)
		return
	}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t := time.Now()
		r, err := do(ctx, sh.hc, http.MethodGet, url, bearer(sh.tok), nil)
		if err != nil {
			s.rec.observe(s.step(sh, StepOrderGet), errOutcome(err), t, time.Since(t), true)
			break
		}
		s.rec.observe(s.step(sh, StepOrderGet), r.outcome(), t, time.Since(t), true)
		delay := orderPollEvery
		if r.busy() {
			delay = orderPollBusy
			if r.RetryAfter > 0 {
				delay = r.RetryAfter
			}
		}
		if r.Status == http.StatusOK {
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
	payURL := url + "/pay"
	for attempt := 0; attempt < 10 && ctx.Err() == nil; attempt++ {
		t := time.Now()
		r, err := do(ctx, sh.hc, http.MethodPost, payURL, bearer(sh.tok), map[string]string{"paymentToken": "loadtest"})
		if err != nil {
			s.rec.observe(s.step(sh, StepPay), errOutcome(err), t, time.Since(t), true)
			return
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
		case r.Code == "NOT_PAYABLE_YET" || r.busy():
			if !sleepCtx(ctx, max(retryDelay(r), 200*time.Millisecond)) {
				return
			}
		default:
			return
		}
	}
}
