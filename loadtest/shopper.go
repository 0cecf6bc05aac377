package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	StepReconnect    = "reconnect"     // a room connection lost ("drop …") or a dial that failed and is tried again
	StepRejoin       = "rejoin"        // from losing the room to its first answer again (outcome: the state, "place_lost")
	StepSaleOrder    = "sale_order"    // each GET of the sale's order (after a lost purchase answer)
	StepWSConnect    = "ws_connect"    // route name of the WebSocket upgrade in the 5xx and network-error counts
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
	base   string // the gateway in use
	gw     int    // its index in the run's gateways
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
	ExpiresAtMs    int64       `json:"expiresAtMs"`
	NotBeforeMs    int64       `json:"notBeforeMs"`
	HoldUntilMs    int64       `json:"holdUntilMs"` // queue order: the unit is held until then
	Items          []roomItem  `json:"items"`
	Position       json.Number `json:"position"`
}

// decodeRoomMsg decodes a room message with goccy/go-json, which needs a
// fraction of encoding/json's CPU: at a drop's opening the tool decodes
// ten thousand admissions within a second, on the cores the gateways need.
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
	// buyNotAdmitted: the purchase was refused 403 NOT_ADMITTED (the
	// admission expired or was lost): the shopper waits in the room for
	// a new one.
	buyNotAdmitted
)

// wait tracks one shopper's time in the room, across reconnections.
type wait struct {
	joined       bool
	joinFail     string    // outcome of the last failed join attempt before the first answer
	start        time.Time // join start
	waitFrom     time.Time // max(join, opening)
	soldOut      bool
	counted      bool // in the sold-out counter
	admitted     bool
	waitObserved bool // the admitted-wait step is recorded
	ended        bool // the room said ENDED or refused the shopper for good
	lastAdm      *roomMsg
	order        *orderRecord // bought: the order to follow up after leaving the room
	opensAtMs    int64

	lostAt    time.Time // when the room was lost (zero: connected)
	lastState string    // last room state seen
	lastPos   int64     // last WAITING position seen
	admToken  string    // last admission token received
	admExpMs  int64     // its expiry
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
	if !w.admitted && !w.waitObserved {
		// The wait ended in SOLD_OUT; an admitted shopper's wait already
		// ended in ADMITTED (its 410 is in the purchase step).
		w.waitObserved = true
		s.rec.observe(s.step(sh, StepAdmittedWait), "SOLD_OUT", w.waitFrom, max(now.Sub(w.waitFrom), 0), false)
	}
	s.rec.mark(markFirstSoldOut, now)
	if !w.counted {
		w.counted = true
		s.rec.live.soldOut.Add(1)
	}
}

func (s *shard) admittedNow(sh *shopper, w *wait, m *roomMsg) {
	now := time.Now()
	if m.AdmissionToken != "" && m.AdmissionToken != w.admToken {
		// A new admission (the first, or a new turn after an expired
		// one); the same token sent again on a rejoin is not one.
		w.admToken, w.admExpMs = m.AdmissionToken, m.ExpiresAtMs
		s.rec.admission(now)
	}
	if !w.admitted {
		s.rec.live.admitted.Add(1)
		if shadowShopper(s.cfg, sh.userID) {
			s.rec.live.shadowAdmitted.Add(1)
		}
	}
	if !w.waitObserved {
		w.waitObserved = true
		s.rec.observe(s.step(sh, StepAdmittedWait), "ADMITTED", w.waitFrom, max(now.Sub(w.waitFrom), 0), false)
	}
	w.admitted = true
	s.rec.mark(markFirstAdmitted, now)
	s.rec.mark(markLastAdmitted, now)
}

// rejoined handles the first answer of the room after it was lost: the
// rejoin step, and whether the shopper got its place back (a rejoin with
// the same access token keeps the place: a WAITING position no larger
// than the last one seen, or the admission while it has not expired).
func (s *shard) rejoined(sh *shopper, w *wait, m *roomMsg) {
	if w.lostAt.IsZero() {
		return
	}
	state := m.State
	if m.Type == "admitted" {
		state = "ADMITTED"
	}
	lost := false
	switch {
	case w.lastState == "ADMITTED" && w.order == nil && time.Now().UnixMilli() < w.admExpMs:
		lost = state == "WAITING" || state == "PREQUEUE"
	case w.lastState == "WAITING" && state == "WAITING":
		pos, err := m.Position.Int64()
		lost = err == nil && pos > w.lastPos
	}
	out := state
	if lost {
		out += " place_lost"
		s.rec.live.placesLost.Add(1)
	}
	s.rec.observe(s.step(sh, StepRejoin), out, w.lostAt, time.Since(w.lostAt), false)
	w.lostAt = time.Time{}
}

// seen notes the room state of a message, for the place check of a
// later rejoin.
func (s *shard) seen(w *wait, m *roomMsg) {
	switch {
	case m.Type == "admitted":
		w.lastState = "ADMITTED"
	case m.Type == "status" && m.State != "":
		w.lastState = m.State
		if m.State == "WAITING" {
			if pos, err := m.Position.Int64(); err == nil {
				w.lastPos = pos
			}
			// Stock came back after a sold-out: the shopper waits again.
			w.soldOut = false
		}
	}
}

// run is one shopper's whole life, bounded by ctx.
func (s *shard) run(ctx context.Context, sh *shopper) {
	defer s.rec.live.done.Add(1)
	o := auth.MintOptions{IdentityKey: identityKey(s.cfg, sh.userID)}
	if shadowShopper(s.cfg, sh.userID) {
		risk := shadowRisk
		o.Risk = &risk
		s.rec.live.shadowed.Add(1)
	}
	tok, err := auth.MintWith(s.cfg.JWTSecret, sh.userID, o, s.ttl, time.Now())
	if err != nil {
		s.rec.errorf(err.Error())
		return
	}
	sh.tok = tok
	w := &wait{start: time.Now()}
	if s.cfg.Transport == TransportPolling {
		s.runPolling(ctx, sh, w)
	} else {
		s.runWS(ctx, sh, w)
	}
	s.endWait(ctx, sh, w)
}

// endWait records how a shopper's time in the room ended: a join that
// never got an answer, and a shopper the run stopped while it still
// waited for its turn (or was still trying to buy).
func (s *shard) endWait(ctx context.Context, sh *shopper, w *wait) {
	if !w.joined {
		out := w.joinFail
		if out == "" {
			out = "canceled"
		}
		s.rec.observe(s.step(sh, StepJoin), out, w.start, time.Since(w.start), true)
	}
	if ctx.Err() == nil || w.order != nil || w.soldOut || w.ended {
		return
	}
	s.rec.live.waitingAtEnd.Add(1)
	if w.joined && !w.waitObserved {
		w.waitObserved = true
		s.rec.observe(s.step(sh, StepAdmittedWait), "canceled", w.waitFrom, max(time.Since(w.waitFrom), 0), false)
	}
}

// runWS keeps the shopper in the WebSocket room as the shop page does:
// a connection that drops or cannot be opened is tried again after a
// backoff, on the next gateway after a transport error, with the same
// access token, until the shopper is done or the run ends.
func (s *shard) runWS(ctx context.Context, sh *shopper, w *wait) {
	bo := s.newBackoff(sh.userID, 0x3c6ef372fe94f82b)
	for s.roomSession(ctx, sh, w, bo) && ctx.Err() == nil {
		s.rec.live.reconnects.Add(1)
		if w.lostAt.IsZero() && w.joined {
			w.lostAt = time.Now()
		}
		if !sleepCtx(ctx, bo.next()) {
			return
		}
	}
}

// roomSession is one room connection; it reports whether to connect
// again.
func (s *shard) roomSession(ctx context.Context, sh *shopper, w *wait, bo *backoff) bool {
	t0 := time.Now()
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	conn, resp, err := websocket.Dial(dctx, wsURL(sh.base)+queuePath(s.sale.ID), &websocket.DialOptions{HTTPClient: sh.hc.ws})
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		out, status := "ws_"+errOutcome(err), 0
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			status = resp.StatusCode
			out = fmt.Sprintf("ws_%d", status)
			s.rec.response(ctx, sh.prefix+StepWSConnect, apiResult{Status: status, HasRetryAfter: resp.Header.Get("Retry-After") != ""}, nil)
		} else {
			s.rec.response(ctx, sh.prefix+StepWSConnect, apiResult{}, err)
			if gatewayGone(err) {
				s.moveGateway(sh)
			}
		}
		if !w.joined {
			w.joinFail = out
		}
		// A 4xx at the first join (the per-address cap, a block) refuses
		// the shopper; a gateway that failed or is gone, or a 429 on a
		// rejoin (the shoppers of a dead gateway crowding the others),
		// is tried again.
		if status != 0 && status < 500 && !(status == http.StatusTooManyRequests && w.joined) {
			w.ended = true
			s.rec.errorf("ws dial: " + err.Error())
			return false
		}
		s.rec.observe(s.step(sh, StepReconnect), out, t0, time.Since(t0), true)
		return true
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 16)
	if err := writeJSON(ctx, conn, map[string]any{"type": "join", "accessToken": sh.tok}); err != nil {
		if ctx.Err() != nil {
			return false
		}
		s.rec.observe(s.step(sh, StepReconnect), "ws_"+errOutcome(err), t0, time.Since(t0), true)
		return true
	}
	for {
		data, err := readMessage(ctx, conn)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			out := "drop ws_" + errOutcome(err)
			if cs := websocket.CloseStatus(err); cs != -1 {
				out = fmt.Sprintf("drop ws_close_%d", cs)
			}
			s.rec.observe(s.step(sh, StepReconnect), out, t0, time.Since(t0), false)
			if w.joined {
				w.lostAt = time.Now()
			}
			return true
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
			w.ended = true
			return false
		}
		if m.OpensAtMs > 0 {
			w.opensAtMs = m.OpensAtMs
		}
		switch m.Type {
		case "challenge":
			pow, ok := s.solvePow(sh, challenge)
			if !ok {
				w.ended = true
				return false
			}
			if err := writeJSON(ctx, conn, map[string]any{"type": "join", "accessToken": sh.tok, "pow": pow}); err != nil {
				return ctx.Err() == nil
			}
		case "error":
			switch m.Error {
			case "RATE_LIMITED", "UNAVAILABLE", "INTERNAL":
				// Closed with 1013 (try again later) or 1011: the page
				// comes back after its backoff. An INTERNAL error is a
				// server fault the shopper saw, counted with the 5xx.
				if m.Error == "INTERNAL" {
					s.rec.response(ctx, sh.prefix+"room_error", apiResult{Status: http.StatusInternalServerError}, nil)
				}
				if !w.joined {
					w.joinFail = "error " + m.Error
				}
				s.rec.observe(s.step(sh, StepReconnect), "error "+m.Error, t0, time.Since(t0), false)
				if w.joined {
					w.lostAt = time.Now()
				}
				return true
			}
			if !w.joined {
				s.joinedNow(sh, w, "error "+m.Error)
			} else {
				s.rec.observe(s.step(sh, StepAdmittedWait), "error "+m.Error, w.waitFrom, max(time.Since(w.waitFrom), 0), false)
			}
			w.ended = true
			return false
		case "status":
			s.rejoined(sh, w, &m)
			bo.reset()
			s.joinedNow(sh, w, m.State)
			s.seen(w, &m)
			switch m.State {
			case "SOLD_OUT":
				s.soldOutNow(sh, w)
				if !s.cfg.KeepWaiting {
					back := s.linger(ctx, sh, conn)
					if back == nil {
						return false
					}
					// Stock came back while the sold-out page was still
					// open, and the room admitted this shopper: the page
					// shows the buy button again, and the shopper buys.
					if s.onAdmitted(ctx, sh, w, conn, back) {
						return false
					}
				}
			case "ENDED":
				if !w.waitObserved {
					w.waitObserved = true
					s.rec.observe(s.step(sh, StepAdmittedWait), "ENDED", w.waitFrom, max(time.Since(w.waitFrom), 0), false)
				}
				w.ended = true
				return false
			case "ADMITTED":
				// Stock came back after a sold-out while this shopper
				// still holds a valid admission: buy again.
				if w.soldOut && w.lastAdm != nil && s.buyThenLeave(ctx, sh, w, conn, w.lastAdm) {
					return false
				}
			}
		case "admitted":
			bo.reset()
			if s.onAdmitted(ctx, sh, w, conn, &m) {
				return false
			}
		}
	}
}

// onAdmitted handles an admission message: the shopper buys; it reports
// whether the shopper is done in the room (it has left it then).
func (s *shard) onAdmitted(ctx context.Context, sh *shopper, w *wait, conn *websocket.Conn, m *roomMsg) bool {
	s.rejoined(sh, w, m)
	s.joinedNow(sh, w, "ADMITTED")
	s.seen(w, m)
	return s.buyThenLeave(ctx, sh, w, conn, m)
}

// buyThenLeave buys with admission m (no longer sold out for this
// shopper) and leaves the room when the shopper is done; it reports
// whether it left.
func (s *shard) buyThenLeave(ctx context.Context, sh *shopper, w *wait, conn *websocket.Conn, m *roomMsg) bool {
	w.soldOut = false
	if done := s.admittedBuy(ctx, sh, w, m); done {
		s.leave(ctx, sh, w, conn)
		return true
	}
	return false
}

// linger keeps a shopper who saw SOLD_OUT connected, its room read (pings
// answered, statuses dropped), for lingerFor, then leaves; at the run's
// end (ctx) it drops the connection without a close handshake. An
// admission meanwhile (stock given back, as after a failed publish, and
// this shopper's turn) ends the linger: it is returned for the shopper to
// buy, and the connection stays open.
func (s *shard) linger(ctx context.Context, sh *shopper, conn *websocket.Conn) *roomMsg {
	if d := s.lingerFor(sh.userID); d > 0 {
		var stop atomic.Bool
		t := time.AfterFunc(d, func() {
			if stop.CompareAndSwap(false, true) {
				conn.Close(websocket.StatusNormalClosure, "")
			}
		})
		defer t.Stop()
		for {
			b, err := readMessage(ctx, conn)
			if err != nil {
				break // closed by the timer, the server, or ctx
			}
			var m roomMsg
			err = decodeRoomMsg(b.Bytes(), &m)
			msgBufs.Put(b)
			if err == nil && m.Type == "admitted" && stop.CompareAndSwap(false, true) {
				return &m
			}
		}
		if ctx.Err() != nil {
			conn.CloseNow()
			return nil
		}
	}
	conn.Close(websocket.StatusNormalClosure, "") // a no-op when already closed
	return nil
}

// admittedBuy buys after an admission; it reports whether the shopper is
// done in the room (bought: w.order is set; failed; or sold out without
// KeepWaiting). A shopper refused NOT_ADMITTED stays for a new turn.
func (s *shard) admittedBuy(ctx context.Context, sh *shopper, w *wait, m *roomMsg) bool {
	s.admittedNow(sh, w, m)
	w.lastAdm = m
	// A first-wave admission (made before the opening) buys from its
	// not-before: the shopper waits for it, as the page does.
	if d := time.Until(time.UnixMilli(m.NotBeforeMs)); m.NotBeforeMs > 0 && d > 0 && !sleepCtx(ctx, d) {
		return true
	}
	// A person reads the page before the click; a fast client does not.
	if d := s.reaction(sh.userID); d > 0 && !sleepCtx(ctx, d) {
		return true
	}
	res, o := s.buy(ctx, sh, m)
	switch res {
	case buyBought:
		w.order = &o
		return true
	case buySoldOut:
		s.soldOutNow(sh, w)
		return !s.cfg.KeepWaiting
	case buyNotAdmitted:
		return false
	default:
		// Refused or given up; one the run stopped still waited.
		w.ended = ctx.Err() == nil
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
// handshake into the busiest seconds of the sale. A room lost meanwhile is
// not reconnected: the follow-up needs only the API.
func (s *shard) stayWhileFollowing(ctx context.Context, sh *shopper, o orderRecord, conn *websocket.Conn) {
	done := make(chan struct{})
	follower := *sh // its own gateway choice: the follow-up moves on its own
	go func() {
		defer close(done)
		s.afterOrder(ctx, &follower, o)
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
// (websocket.Conn.Read) would spend the load tool's CPU on allocations and
// page faults at a drop's opening.
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

// runPolling is the polling transport: POST joins, GET reads the status
// every PollInterval (jittered). A transport error or a 5xx is tried
// again after a backoff, on the next gateway after a transport error.
func (s *shard) runPolling(ctx context.Context, sh *shopper, w *wait) {
	bo := s.newBackoff(sh.userID, 0x3c6ef372fe94f82b)
	path := queuePath(s.sale.ID)
	var body any
	var m roomMsg
	for challenges, busy := 0, 0; ; {
		t0 := time.Now()
		r, err := s.call(ctx, sh, StepJoin, http.MethodPost, path, bearer(sh.tok), body)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.joinFail = errOutcome(err)
			s.rec.observe(s.step(sh, StepReconnect), errOutcome(err), t0, time.Since(t0), true)
			s.rec.live.reconnects.Add(1)
			if !sleepCtx(ctx, bo.next()) {
				return
			}
			continue
		}
		var c struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(r.Body, &c) == nil && c.Type == "challenge" {
			// The answer body is the challenge, whatever its status
			// (defense/POW.md); the next POST carries the solution.
			s.rec.observe(s.step(sh, StepPoll), "challenge", w.start, time.Since(w.start), true)
			pow, ok := s.solvePow(sh, r.Body)
			if challenges++; !ok || challenges > 4 {
				w.ended = true
				return
			}
			body = map[string]any{"pow": pow}
			continue
		}
		if r.Status == http.StatusOK {
			if json.Unmarshal(r.Body, &m) != nil {
				w.joinFail, w.ended = "bad_body", true
				return
			}
			break
		}
		if r.Status >= 500 || (r.Status == http.StatusTooManyRequests && busy < 3) {
			if r.Status == http.StatusTooManyRequests {
				busy++
			}
			s.rec.observe(s.step(sh, StepPoll), r.outcome(), t0, time.Since(t0), true)
			d := retryDelay(r)
			if !r.HasRetryAfter {
				d = bo.next()
			}
			if !sleepCtx(ctx, d) {
				return
			}
			continue
		}
		s.joinedNow(sh, w, r.outcome())
		w.ended = true
		return
	}
	bo.reset()
	s.joinedNow(sh, w, m.State)
	s.seen(w, &m)
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
			if !w.waitObserved {
				w.waitObserved = true
				s.rec.observe(s.step(sh, StepAdmittedWait), "ENDED", w.waitFrom, max(time.Since(w.waitFrom), 0), false)
			}
			w.ended = true
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
		r, err := s.call(ctx, sh, StepPoll, http.MethodGet, path, bearer(sh.tok), nil)
		if err != nil {
			s.rec.observe(s.step(sh, StepPoll), errOutcome(err), t0, time.Since(t0), true)
			if ctx.Err() != nil {
				break
			}
			if w.lostAt.IsZero() {
				w.lostAt = t0
			}
			s.rec.live.reconnects.Add(1)
			if !sleepCtx(ctx, bo.next()) {
				break
			}
			continue
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
			w.ended = true
			return
		}
		s.rejoined(sh, w, &m)
		bo.reset()
		s.seen(w, &m)
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

func itemFromURL(u string) int64 {
	var id int64
	if i := strings.Index(u, "/items/"); i >= 0 {
		fmt.Sscanf(u[i+len("/items/"):], "%d", &id)
	}
	return id
}

// reaction is the shopper's time from the moment its token buys to the
// click (Config.Reaction, Config.FastShare): 0 for a fast client, else a
// log-normal draw around the median, both fixed by the seed and the user.
func (s *shard) reaction(userID int64) time.Duration {
	if s.cfg.Reaction <= 0 {
		return 0
	}
	rng := s.draw(userID, 0x7f4a7c15d1b54a32)
	if rng.Float64() < s.cfg.FastShare {
		return 0
	}
	return time.Duration(float64(s.cfg.Reaction) * math.Exp(0.5*rng.NormFloat64()))
}

// fastClient reports whether the shopper is a fast client (Reaction set
// and the shopper drawn among FastShare).
func (s *shard) fastClient(userID int64) bool {
	return s.cfg.Reaction > 0 && s.draw(userID, 0x7f4a7c15d1b54a32).Float64() < s.cfg.FastShare
}

// draw is a shopper's own random stream for one purpose (salt): fixed by
// the run's seed and the user id, so a run with the same seed repeats
// every shopper's choices whichever process and gateway serve it.
// identityKey is the identity key of a shopper's token ("" without
// Config.DuplicateIdentities): its own person's, or, for the drawn share,
// the person's of the shopper before it (a second account).
func identityKey(cfg Config, userID int64) string {
	if cfg.DuplicateIdentities <= 0 {
		return ""
	}
	person := userID
	if userID > cfg.UserBase+1 && rand.New(rand.NewPCG(cfg.Seed^0x1d5e, uint64(userID))).Float64() < cfg.DuplicateIdentities {
		person = userID - 1
	}
	return "person-" + strconv.FormatInt(person, 10)
}

// shadowRisk is the risk claim of a shadowed shopper's token, and
// shadowRiskAbove the threshold the run sets (Config.ShadowShare).
const (
	shadowRisk      = 0.99
	shadowRiskAbove = 0.9
)

// shadowShopper reports whether the shopper is drawn among
// Config.ShadowShare: its token carries shadowRisk.
func shadowShopper(cfg Config, userID int64) bool {
	return cfg.ShadowShare > 0 && rand.New(rand.NewPCG(cfg.Seed^0x5ad0, uint64(userID))).Float64() < cfg.ShadowShare
}

func (s *shard) draw(userID int64, salt uint64) *rand.Rand {
	return rand.New(rand.NewPCG(s.cfg.Seed^salt, uint64(userID)))
}

// firstItem draws, from the seed and the user id, the first of n items a
// shopper tries. It is not the user id modulo n: a shopper's gateway is
// its index modulo the gateways, so with 10 items over 6 gateways the odd
// items would all be tried first through the odd gateways, and whichever
// half of the gateways ran slower would sell its five items later.
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
