package waitroom

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale"
)

// Buffer sizes of a hijacked connection. net/http would keep 4 KiB each;
// the waiting room reads one small join and writes messages of a few
// hundred bytes (bufio passes larger ones straight through), so small
// buffers keep a connection's memory low, and a gateway holds a crowd of
// them.
const (
	readBufSize  = 256
	writeBufSize = 256
)

// conn is one shopper's WebSocket. Its handshake runs on a goroutine of
// Room.work; once joined it waits in the room's poller (idle.go), or on
// a reader goroutine of its own; writes go through the Room's writer pool.
type conn struct {
	r   *Room
	ws  *websocket.Conn
	ic  *idleConn     // the socket under ws, when this room hijacked it
	br  *bufio.Reader // ws's read buffer
	ip  netip.Addr
	seq uint64
	// overCap: accepted over the per-address cap (Config.MaxConnsPerIP)
	// for the shadow queue (shadowQueue's perAddress rule).
	overCap bool

	closeOnce sync.Once
	// closeMu is held while the connection closes with a close handshake
	// (it leaves the poller; the library then reads, on the closing
	// goroutine) and while wait looks at the read buffer.
	closeMu sync.Mutex

	// Set at join, then guarded by sr.mu.
	sr         *saleRoom
	user       int64
	ticket     int64
	place      int64  // -1 until known (after the draw)
	shadow     bool   // in the shadow queue: ticket is the one shown, in no queue
	tier       int    // the tier the access rule found (0: none), for a restore
	admittedAt int64  // 0 until admitted
	joinedAt   int64  // Unix ms of the join on this connection (the report's wait)
	heldItem   int64  // queue order: the item held for the shopper (0: none, or race)
	chosen     int64  // queue order: the item the shopper chose, as this connection knows it (0: none)
	last       view   // last view queued
	lastTick   uint64 // tick of the last status queued
	pingWaited bool   // its last ping slot passed without a ping (Config.Competing)
	bought     bool   // its admission expired after the user bought: stays ADMITTED
	// The operator's message as last queued to it ("" and 0: none).
	msgText string
	msgAt   int64

	// Pending output, guarded by mu. A newer status replaces an unsent
	// one, so a connection never holds more than one status, one admitted
	// message and one test payload.
	mu        sync.Mutex
	pend      view
	pendOpens int64
	hasPend   bool
	pendAdm   []byte
	pendMsg   []byte
	pendRaw   []byte
	pendReply []byte // the refusal of a choose
	// The shopper's member secret (hex), until a status carries it: the
	// first status after the join does.
	pendSecret string
	queued     bool // on sendQ
	queuedHi   bool // on sendHi
	writing    bool // a writer is sending its messages: no other may
	dead       bool
}

// push queues a status (and an admitted message, when adm != nil).
func (c *conn) push(v view, opensMs int64, adm []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.pend, c.pendOpens, c.hasPend = v, opensMs, true
	if adm != nil {
		c.pendAdm = adm
		c.scheduleHi()
		return
	}
	c.schedule()
}

// pushMessage queues the operator's message (a newer one replaces an
// unsent one); it goes after any status queued with it.
func (c *conn) pushMessage(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.pendMsg = b
	c.schedule()
}

// pushReply queues the answer to a client message (a newer one replaces
// an unsent one).
func (c *conn) pushReply(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.pendReply = b
	c.schedule()
}

// pushRaw queues an arbitrary message (tests use it to stall a writer).
func (c *conn) pushRaw(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.pendRaw = b
	c.schedule()
}

// scheduleHi puts c on the admissions' write queue, which the writers
// empty before the other. Called with c.mu held.
func (c *conn) scheduleHi() {
	if !c.queuedHi {
		c.queuedHi = true
		c.r.enqueue(c, true)
	}
}

// schedule puts c on the write queue once. Called with c.mu held.
func (c *conn) schedule() {
	if !c.queued && !c.queuedHi {
		c.queued = true
		c.r.enqueue(c, false)
	}
}

// enqueue appends c to a write queue (hi: the admissions') and wakes a
// writer.
func (r *Room) enqueue(c *conn, hi bool) {
	r.sendMu.Lock()
	if hi {
		r.sendHi = append(r.sendHi, c)
	} else {
		r.sendQ = append(r.sendQ, c)
	}
	r.sendCond.Signal()
	r.sendMu.Unlock()
}

// writer sends queued messages until Run stops it; slot says what it is
// sending, for writeWatch.
func (r *Room) writer(slot *writeSlot) {
	buf := make([]byte, 0, 256)
	for {
		r.sendMu.Lock()
		for len(r.sendHi) == 0 && len(r.sendQ) == 0 && !r.sendStop {
			r.sendCond.Wait()
		}
		if r.sendStop {
			r.sendMu.Unlock()
			return
		}
		q := &r.sendQ
		if len(r.sendHi) > 0 {
			q = &r.sendHi
		}
		c := (*q)[0]
		(*q)[0] = nil
		*q = (*q)[1:]
		if len(*q) == 0 {
			*q = nil
		}
		r.sendMu.Unlock()
		slot.c.Store(c)
		slot.since.Store(r.monotonic())
		buf = c.flush(buf)
		slot.since.Store(0) // before the next connection is stored: see writeWatch
		slot.c.Store(nil)
	}
}

// writeSlot is the connection one writer is sending to, and since when
// (Room.monotonic; 0: none). A flush writes with no context of its own:
// a write context costs the library a callback registered and removed on
// every write (context.AfterFunc), about 5% of a push's CPU, where this
// costs a clock read and four atomic stores.
type writeSlot struct {
	c     atomic.Pointer[conn]
	since atomic.Int64
}

// monotonic is the time since the room was made, in ns on the monotonic
// clock, never 0.
func (r *Room) monotonic() int64 { return int64(time.Since(r.started)) | 1 }

// writeWatch drops every client whose flush has run past WriteTimeout,
// looking every quarter of it, until stop is closed: a write is cut
// between WriteTimeout and 1¼ × WriteTimeout after it began.
func (r *Room) writeWatch(stop <-chan struct{}) {
	t := time.NewTicker(max(r.cfg.WriteTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.dropSlowWrites(r.writing, r.monotonic())
		}
	}
}

// dropSlowWrites closes the connection of each writer that has been
// writing since before now − WriteTimeout; closing it ends the write,
// whose error drops the client (flush). A writer clears since before it
// stores its next connection, so the since read again after the
// connection is still this write's only if the connection is its own.
func (r *Room) dropSlowWrites(slots []writeSlot, now int64) {
	for i := range slots {
		s := &slots[i]
		since := s.since.Load()
		if since == 0 || now-since <= int64(r.cfg.WriteTimeout) {
			continue
		}
		c := s.c.Load()
		if c == nil || s.since.Load() != since {
			continue
		}
		r.log.Debug("drop slow client", "writing", time.Duration(now-since))
		_ = c.ws.CloseNow()
	}
}

// flush writes c's pending messages; a client that does not take them
// within WriteTimeout is dropped (writeWatch closes its connection).
//
// One writer at a time sends a connection's messages, so they leave in the
// order they were queued: a writer that finds another one writing leaves
// the messages pending, and the writing one queues the connection again
// when more is pending after its write.
func (c *conn) flush(buf []byte) []byte {
	ctx := context.Background() // bounded by writeWatch
	c.mu.Lock()
	c.queued, c.queuedHi = false, false
	if c.writing || c.dead {
		c.mu.Unlock()
		return buf
	}
	v, opens, has, adm, msg, raw, reply := c.pend, c.pendOpens, c.hasPend, c.pendAdm, c.pendMsg, c.pendRaw, c.pendReply
	if !has && adm == nil && msg == nil && raw == nil && reply == nil {
		c.mu.Unlock()
		return buf // already flushed from the other queue
	}
	secret := ""
	if has {
		secret, c.pendSecret = c.pendSecret, ""
	}
	c.hasPend, c.pendAdm, c.pendMsg, c.pendRaw, c.pendReply, c.writing = false, nil, nil, nil, nil, true
	c.mu.Unlock()
	var err error
	if reply != nil {
		err = c.ws.Write(ctx, websocket.MessageText, reply)
	}
	if has && err == nil {
		buf = appendStatus(buf[:0], v, c.r.cfg.Now().UnixMilli(), opens)
		if secret != "" {
			buf = appendDrawSecret(buf, secret)
		}
		err = c.ws.Write(ctx, websocket.MessageText, buf)
	}
	if adm != nil && err == nil {
		err = c.ws.Write(ctx, websocket.MessageText, adm)
	}
	if msg != nil && err == nil {
		err = c.ws.Write(ctx, websocket.MessageText, msg)
	}
	if raw != nil && err == nil {
		err = c.ws.Write(ctx, websocket.MessageText, raw)
	}
	c.mu.Lock()
	c.writing = false
	if err != nil {
		c.dead = true
	} else if c.pendAdm != nil {
		c.scheduleHi()
	} else if c.hasPend || c.pendMsg != nil || c.pendRaw != nil || c.pendReply != nil {
		c.schedule()
	}
	c.mu.Unlock()
	if err != nil {
		c.r.log.Debug("drop slow or gone client", "err", err)
		_ = c.ws.CloseNow()
	}
	if cap(buf) > 4096 {
		buf = make([]byte, 0, 256)
	}
	return buf
}

func (c *conn) markDead() {
	c.mu.Lock()
	c.dead = true
	c.mu.Unlock()
}

// pingAll checks that each of conns still answers; one that does not
// within IdleTimeout/2 is closed. Pings are spread over the ticks (by conn
// seq), so few run at once; a tick's share one deadline, so that they
// cost one timer, not one each (a waiting room at rest spends most of its
// CPU on pings).
func (r *Room) pingAll(conns []*conn) {
	if len(conns) == 0 {
		return
	}
	b := &pingBatch{}
	b.ctx, b.cancel = context.WithTimeout(context.Background(), r.cfg.IdleTimeout/2)
	b.left.Store(int64(len(conns)))
	for _, c := range conns {
		r.pings.Add(1)
		r.work.Go(func() {
			defer r.pings.Done()
			if err := c.ws.Ping(b.ctx); err != nil {
				_ = c.ws.CloseNow()
			}
			if b.left.Add(-1) == 0 {
				b.cancel() // the last one back releases the timer
			}
		})
	}
}

// pingBatch is one tick's pings: their deadline, and how many are out.
type pingBatch struct {
	ctx    context.Context
	cancel context.CancelFunc
	left   atomic.Int64
}

// fail sends an error message and closes with the code's close status.
func (c *conn) fail(err error) {
	code := flashsale.ErrorCode(err)
	if code == flashsale.CodeInternal {
		code = flashsale.CodeUnavailable
		c.r.log.Warn("join failed", "err", err)
	}
	msg := flashsale.ErrorMessage(err)
	if code == flashsale.CodeUnavailable {
		msg = "the waiting room is unavailable; retry shortly"
	}
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	c.closeOnce.Do(func() {
		c.markDead()
		end := c.leaveIdle()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.ws.Write(ctx, websocket.MessageText, encodeError(code, msg))
		cancel()
		_ = c.ws.Close(closeStatus(code), string(code))
		if end != nil {
			end()
		}
	})
}

// closeStatus maps an error code to a WebSocket close status (the one
// place this mapping lives).
func closeStatus(code flashsale.Code) websocket.StatusCode {
	switch code {
	case flashsale.CodeInvalid:
		return websocket.StatusUnsupportedData // 1003
	case flashsale.CodeTooLarge:
		return websocket.StatusMessageTooBig // 1009
	case flashsale.CodeUnauthenticated, flashsale.CodeBlocked, flashsale.CodeNotFound, flashsale.CodeForbidden,
		flashsale.CodeDuplicateIdentity, flashsale.CodeNotInvited, flashsale.CodeCodeInvalid, flashsale.CodeCodeUsed,
		flashsale.CodeNotYet:
		return websocket.StatusPolicyViolation // 1008
	case flashsale.CodeRateLimited, flashsale.CodeUnavailable:
		return websocket.StatusTryAgainLater // 1013
	default:
		return websocket.StatusInternalError // 1011
	}
}

var (
	errTooLarge = flashsale.Errorf(flashsale.CodeTooLarge, "message too large")
	errBinary   = flashsale.Errorf(flashsale.CodeInvalid, "binary messages are not accepted; send JSON text")
)

// readMessage reads one client message of at most MaxMessageBytes. A
// binary message is errBinary: client messages are JSON text.
func (c *conn) readMessage(ctx context.Context) ([]byte, error) {
	typ, rd, err := c.ws.Reader(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, errBinary
	}
	limit := c.r.cfg.MaxMessageBytes
	b, err := io.ReadAll(io.LimitReader(rd, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}

// SalePath is the path prefix of the queue endpoint:
// /api/flash-sales/sales/{saleId}/queue.
const SalePath = "/api/flash-sales/sales/"

// saleIDFromPath finds {saleId} (a ServeMux pattern value, or the path).
func saleIDFromPath(req *http.Request) (int64, bool) {
	s := req.PathValue("saleId")
	if s == "" {
		rest, ok := strings.CutPrefix(req.URL.Path, SalePath)
		if !ok {
			return 0, false
		}
		if s, ok = strings.CutSuffix(rest, "/queue"); !ok {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, false
	}
	return id, true
}

func httpError(w http.ResponseWriter, status int, code flashsale.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": string(code), "message": msg})
}

// ServeHTTP is the WebSocket endpoint GET /api/flash-sales/sales/{saleId}/queue.
// Requests without Upgrade get 426 (the gateway serves polling through
// Join and Status).
func (r *Room) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	saleID, ok := saleIDFromPath(req)
	if !ok {
		httpError(w, http.StatusNotFound, flashsale.CodeNotFound, "no such sale")
		return
	}
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		httpError(w, http.StatusUpgradeRequired, flashsale.CodeInvalid, "WebSocket upgrade required")
		return
	}
	ip := r.cfg.ClientIP(req)
	key := capKey(ip)
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		// Another gateway can take the shopper at once; every 503 of the
		// contract says when to retry.
		w.Header().Set("Retry-After", "1")
		httpError(w, http.StatusServiceUnavailable, flashsale.CodeUnavailable, "shutting down")
		return
	}
	if r.cfg.MaxConns > 0 && r.total >= r.cfg.MaxConns {
		r.mu.Unlock()
		w.Header().Set("Retry-After", "2")
		httpError(w, http.StatusServiceUnavailable, flashsale.CodeUnavailable, "this gateway is full; retry shortly")
		return
	}
	overCap := r.perIP[key] >= r.cfg.MaxConnsPerIP
	if overCap && (r.perIP[key] >= shadowCapFactor*r.cfg.MaxConnsPerIP || !r.shadows(ShadowPerAddress)) {
		r.mu.Unlock()
		httpError(w, http.StatusTooManyRequests, flashsale.CodeRateLimited, "too many connections from this address")
		return
	}
	r.perIP[key]++
	r.total++
	r.handlers.Add(1)
	r.mu.Unlock()
	release := func() {
		r.mu.Lock()
		r.total--
		if r.perIP[key]--; r.perIP[key] <= 0 {
			delete(r.perIP, key)
		}
		r.mu.Unlock()
		r.handlers.Done()
	}
	sb := &smallBuffers{ResponseWriter: w}
	ws, err := websocket.Accept(sb, req, &websocket.AcceptOptions{OriginPatterns: r.cfg.OriginPatterns})
	if err != nil {
		release()
		return // Accept answered the request
	}
	// The handshake runs on a goroutine of r.work and ServeHTTP returns, so
	// that the server frees its per-connection state (buffers, request, a
	// deep stack): this halves the memory of an idle connection.
	r.work.Go(func() { r.serveConn(ws, sb.ic, sb.br, ip, overCap, saleID, release) })
}

// capKey is what the per-address connection cap counts by: the address
// for IPv4, its /64 for IPv6 (one subscriber holds a whole /64, so its
// single addresses cost nothing to change).
func capKey(ip netip.Addr) netip.Addr {
	if ip.Is6() && !ip.Is4In6() {
		if p, err := ip.WithZone("").Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// serveConn runs the handshake; a joined connection then waits for its
// shopper's next message in the room's poller (idle.go), or on a fresh
// goroutine whose stack stays small (the handshake's deep calls would
// otherwise keep this goroutine's stack grown for the connection's
// life). release runs when the connection is done.
func (r *Room) serveConn(ws *websocket.Conn, ic *idleConn, br *bufio.Reader, ip netip.Addr, overCap bool, saleID int64, release func()) {
	ws.SetReadLimit(r.cfg.MaxMessageBytes + 1)
	c := &conn{r: r, ws: ws, ic: ic, br: br, ip: ip, overCap: overCap, place: -1}
	r.mu.Lock()
	r.connSeq++
	c.seq = r.connSeq
	closing := r.closing
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	r.m.conns.Inc()
	done := func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		r.m.conns.Dec()
		c.markDead()
		_ = ws.CloseNow()
		release()
	}
	if closing {
		c.goAway()
		done()
		return
	}
	sr := c.handshake(saleID)
	if sr == nil {
		done()
		return
	}
	c.wait(sr, func() {
		c.leave(sr)
		done()
	})
}

// watch reads until the client leaves, blocked in the library's reader.
func (c *conn) watch(sr *saleRoom, lim *chooseLimit) {
	for {
		b, err := c.readMessage(context.Background())
		if !c.handle(sr, lim, b, err) {
			return
		}
	}
}

// handle answers a message read after the join; false when the
// connection is done. The only client message then is a choose (queue
// order): it is answered with a status, or a choiceRefused, and the
// connection stays. Anything else is INVALID and closes it.
func (c *conn) handle(sr *saleRoom, lim *chooseLimit, b []byte, err error) bool {
	if err != nil {
		if errors.Is(err, errTooLarge) || errors.Is(err, errBinary) {
			c.fail(err)
		}
		return false
	}
	m, err := ParseClientMessage(b)
	if err == nil && (m.Type != TypeChoose || !c.queueOrder(sr)) {
		// A race sale expects nothing after the join, as ever.
		err = errJoined
	}
	if err != nil {
		c.fail(err)
		return false
	}
	if !lim.allow(c.r.cfg.Now()) {
		c.pushReply(appendChoiceRefused(nil, m.ItemID, errChooseRate))
		return true
	}
	c.choose(sr, m.ItemID)
	return true
}

// errJoined refuses a message after the join: anything but a choose in a
// sale allocated in queue order (a race sale's answer is as it always was).
var errJoined = flashsale.Errorf(flashsale.CodeInvalid, "already joined; no further messages expected")

func (c *conn) queueOrder(sr *saleRoom) bool {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.sale.QueueOrder()
}

// chooseLimit spaces a connection's chooses: a burst of chooseBurst, then
// one per second, so that a client cannot turn its socket into a stream
// of Redis scripts.
type chooseLimit struct {
	tokens float64
	at     time.Time
}

const chooseBurst = 5

var errChooseRate = flashsale.Errorf(flashsale.CodeRateLimited, "too many choices; wait a moment")

func (l *chooseLimit) allow(now time.Time) bool {
	if l.at.IsZero() {
		l.tokens = chooseBurst
	} else {
		l.tokens = min(chooseBurst, l.tokens+now.Sub(l.at).Seconds())
	}
	l.at = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// choose records the connection's choice (Room.Choose) and answers it: a
// status carrying the choice at once, or a choiceRefused.
func (c *conn) choose(sr *saleRoom, itemID int64) {
	r := c.r
	var err error
	sr.mu.Lock()
	shadow, sale := c.shadow, sr.sale
	sr.mu.Unlock()
	if shadow {
		// The shadow queue answers from memory: no Redis work.
		err = checkChoice(sale, itemID)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = r.Choose(ctx, flashsale.Principal{UserID: c.user}, sr.id, itemID)
		cancel()
	}
	if err != nil {
		if flashsale.ErrorCode(err) == flashsale.CodeInternal {
			r.log.Warn("record a choice", "sale", sr.id, "user", c.user, "err", err)
			err = flashsale.Errorf(flashsale.CodeUnavailable, "the choice could not be recorded; retry shortly")
		}
		c.pushReply(appendChoiceRefused(nil, itemID, err))
		return
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	c.chosen = itemID
	sr.unsettle(c)
	v := c.viewOf(sr, r.cfg.Now())
	if v.state == StateAdmitted {
		return // the admitted message is on its way: it names the held item
	}
	c.last = v
	c.push(v, sr.sale.StartsAt.UnixMilli(), nil)
}

// viewOf is what the connection's shopper sees now: the sale room's view
// of its place, with its choice while the turn has not come. Called with
// sr.mu held.
func (c *conn) viewOf(sr *saleRoom, now time.Time) view {
	v := sr.viewOf(c.place, now)
	if v.state != StateAdmitted {
		v.chosen = c.chosen
	}
	return v
}

// leave takes a joined connection out of its sale room. An admitted
// shopper's presence is marked once more, so that its grace period
// (Config.AdmittedGrace) runs from the moment it left.
func (c *conn) leave(sr *saleRoom) {
	r := c.r
	sr.mu.Lock()
	sr.removeConn(c)
	now := r.cfg.Now()
	admitted := c.admittedAt != 0 && !c.bought && now.UnixMilli() < c.admittedAt+r.ttl(sr.sale).Milliseconds() && !sr.sale.QueueOrder()
	held := heldConn{user: c.user, place: c.place}
	sr.mu.Unlock()
	if admitted && r.cfg.AdmittedGrace > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r.markPresent(ctx, sr.id, []heldConn{held}, now)
		cancel()
	}
	r.mu.Lock()
	if r.perUser[c.user]--; r.perUser[c.user] <= 0 {
		delete(r.perUser, c.user)
	}
	r.mu.Unlock()
}

// handshake reads the join (answering a challenge if the guard sends one)
// and enters the shopper in the queue. It returns nil after sending an
// error, or when the client left.
func (c *conn) handshake(saleID int64) *saleRoom {
	r := c.r
	sale, ok := r.sales.Sale(saleID)
	if !ok {
		c.fail(notFound())
		return nil
	}
	timer := time.AfterFunc(r.cfg.HandshakeTimeout, func() {
		c.fail(flashsale.Errorf(flashsale.CodeInvalid, "no join message in time"))
	})
	defer timer.Stop()
	ctx := context.Background()
	challenged := false
	for {
		b, err := c.readMessage(ctx)
		if err != nil {
			if errors.Is(err, errTooLarge) || errors.Is(err, errBinary) {
				c.fail(err)
			}
			return nil
		}
		m, err := ParseClientMessage(b)
		if err == nil && m.Type != TypeJoin {
			err = errNotJoin
		}
		if err != nil {
			c.fail(err)
			return nil
		}
		p, err := r.access.Verify(m.AccessToken)
		if err != nil {
			c.fail(flashsale.Errorf(flashsale.CodeUnauthenticated, "missing, invalid or expired access token"))
			return nil
		}
		var guardErr error
		if r.guard != nil {
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ch, err := r.guard.CheckJoin(gctx, c.ip, p.UserID, saleID, m.PoW)
			cancel()
			var sh *flashsale.Shadow
			if err != nil && !errors.As(err, &sh) {
				r.guardRefused(saleID, err)
				c.fail(err)
				return nil
			}
			guardErr = err
			if ch != nil && challenged && r.shadows(ShadowPow) {
				// Challenged once and back without a solution: the
				// shadow queue rather than another challenge.
				ch, guardErr = nil, &flashsale.Shadow{Rule: ShadowPow}
			}
			if ch != nil {
				msg, err := challengeMessage(ch)
				if err != nil {
					c.fail(err)
					return nil
				}
				// The first challenge gives the client a whole handshake
				// timeout to solve it; a join that comes back without a
				// solution gets another challenge but no more time, so a
				// connection cannot be held by joining forever.
				if !challenged {
					challenged = true
					timer.Reset(r.cfg.HandshakeTimeout)
				}
				wctx, cancel := context.WithTimeout(ctx, r.cfg.WriteTimeout)
				err = c.ws.Write(wctx, websocket.MessageText, msg)
				cancel()
				if err != nil {
					return nil
				}
				continue
			}
		}
		r.mu.Lock()
		if r.perUser[p.UserID] >= r.cfg.MaxConnsPerUser {
			r.mu.Unlock()
			r.tally.refused(saleID, r.cfg.Now(), RuleConnsPerUser)
			c.fail(flashsale.Errorf(flashsale.CodeRateLimited, "too many connections for this user"))
			return nil
		}
		r.perUser[p.UserID]++
		r.mu.Unlock()
		c.user = p.UserID
		jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ticket, sr, err := c.join(jctx, sale, p, guardErr, m.Code)
		if err == nil {
			err = c.enter(jctx, sr, ticket)
		}
		cancel()
		if err != nil {
			r.mu.Lock()
			if r.perUser[c.user]--; r.perUser[c.user] <= 0 {
				delete(r.perUser, c.user)
			}
			r.mu.Unlock()
			c.fail(err)
			return nil
		}
		if !timer.Stop() { // the handshake timeout fired meanwhile
			c.leave(sr)
			return nil
		}
		return sr
	}
}

// join puts the connection's shopper in the sale's queue, or in its
// shadow queue when a shadow rule judged the join (guardErr is the
// guard's verdict): a shadowed shopper is not told of the access rule
// either. code is the invitation code of the join ("" none).
func (c *conn) join(ctx context.Context, sale *flashsale.Sale, p flashsale.Principal, guardErr error, code string) (joinTicket, *saleRoom, error) {
	r := c.r
	if rule := r.joinRule(guardErr, p, c.overCap); rule != "" {
		t, sr, shadowed, err := r.shadowJoin(ctx, sale, p.UserID, rule)
		if err != nil || shadowed {
			return joinTicket{ticket: ticketShadowed, shown: t}, sr, err
		}
	}
	tier, err := r.checkAccess(ctx, sale, p, code)
	if err != nil {
		return joinTicket{}, nil, err
	}
	c.tier = tier
	return r.register(ctx, sale, p, tier)
}

// enter adds the joined connection to its sale room and queues its first
// status (and the admitted message, when its turn has come).
func (c *conn) enter(ctx context.Context, sr *saleRoom, j joinTicket) error {
	r := c.r
	now := r.cfg.Now()
	sr.mu.Lock()
	r.latestSale(sr)
	ticket := j.ticket
	if j.ticket == ticketShadowed {
		ticket, c.shadow = j.shown, true
	}
	c.sr, c.ticket, c.joinedAt = sr, ticket, now.UnixMilli()
	if c.shadow {
		c.place = sr.shadowPlace(ticket, c.user)
	} else if p, ok := sr.place(ticket); ok {
		c.place = p
	}
	v := sr.viewOf(c.place, now)
	opens := sr.sale.StartsAt.UnixMilli()
	place := c.place
	queue := sr.sale.QueueOrder()
	sr.mu.Unlock()
	if queue && v.state != StateAdmitted && !c.shadow {
		// A choice made before (another tab, a reconnect) is shown: the
		// join's script read it.
		c.chosen, v.chosen = j.chosen, j.chosen
	}
	var adm []byte
	if v.state == StateAdmitted {
		at, err := admitUsers(ctx, r.rdb, sr.id, now.UnixMilli(), !queue, []int64{c.user}, []int64{place})
		if err != nil {
			return err
		}
		var held []int64
		if queue && at[0] != 0 {
			if held, err = readHeldItems(ctx, r.rdb, sr.id, []int64{c.user}); err != nil {
				return err
			}
		}
		if at[0] == 0 {
			// Passed over for want of the chosen item (queue order), or
			// the cursor in Redis is ahead of the record: waiting.
			v = view{state: StateWaiting, out: v.out}
			if queue {
				if c.chosen, err = readChoice(ctx, r.rdb, sr.id, c.user); err != nil {
					return err
				}
				sr.mu.Lock()
				v = sr.passedView(c.chosen)
				sr.mu.Unlock()
			}
		} else {
			var item int64
			if len(held) == 1 {
				item = held[0]
			}
			sr.mu.Lock()
			adm = r.admittedMessage(sr, c.user, at[0], item)
			sr.mu.Unlock()
			c.admittedAt, c.heldItem = at[0], item
			r.tally.waited(sr.id, now, c.joinedAt, at[0])
		}
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	c.last = v
	sr.addConn(c)
	c.mu.Lock()
	c.pendSecret = r.MemberSecret(sr.id, c.user)
	c.mu.Unlock()
	c.push(v, opens, adm)
	// A message set before the shopper came goes after the first status.
	r.sendMessage(sr, c)
	return nil
}

func (c *conn) goAway() {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	c.closeOnce.Do(func() {
		c.markDead()
		end := c.leaveIdle()
		_ = c.ws.Close(websocket.StatusGoingAway, "going away")
		if end != nil {
			end()
		}
	})
}

// Shutdown closes every WebSocket with "going away" (1001) and waits for
// their handlers to end, or for ctx (then it drops the rest).
func (r *Room) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	conns := make([]*conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, c := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c.goAway()
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		r.handlers.Wait()
		r.pings.Wait()
		r.work.Close()
		r.closePoller()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		r.mu.Lock()
		for c := range r.conns {
			_ = c.ws.CloseNow()
		}
		r.mu.Unlock()
		return ctx.Err()
	}
}

// smallBuffers hijacks with small bufio buffers instead of net/http's 4 KiB
// ones (a hijacker whose buffers are small already keeps its own), and
// puts an idleConn under the library: ic and br are the connection's.
type smallBuffers struct {
	http.ResponseWriter
	ic *idleConn
	br *bufio.Reader
}

func (w *smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if brw.Writer.Buffered() > 0 {
		if err := brw.Writer.Flush(); err != nil {
			nc.Close()
			return nil, nil, err
		}
	}
	// Bytes the client sent early move from the server's buffer to the
	// idleConn, which reads them first; the library then finds its buffer
	// empty and reads the idleConn.
	ic := newIdleConn(nc)
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		ic.pre = bytes.Clone(b)
	}
	br, bw := brw.Reader, brw.Writer
	if br.Size() <= readBufSize {
		br.Reset(ic)
	} else {
		br = bufio.NewReaderSize(ic, readBufSize)
	}
	if bw.Size() > writeBufSize {
		bw = bufio.NewWriterSize(nc, writeBufSize)
	}
	w.ic, w.br = ic, br
	return ic, bufio.NewReadWriter(br, bw), nil
}
