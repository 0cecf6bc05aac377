package waitroom

import (
	"context"
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

// shadowGuard is a JoinGuard with shadow-queue settings: blocked users go
// to the shadow queue (as the defense's shadowQueue blocklist rule does),
// and rules and risk are as set.
type shadowGuard struct {
	blocked map[int64]bool
	rules   map[string]bool
	risk    float64
	// challenged users get a challenge while they send no proof of work.
	challenged map[int64]bool
}

func (g shadowGuard) CheckJoin(_ context.Context, _ netip.Addr, userID, _ int64, pow json.RawMessage) (json.RawMessage, error) {
	if g.blocked[userID] {
		return nil, &flashsale.Shadow{Rule: ShadowBlocklist}
	}
	if g.challenged[userID] && len(pow) == 0 {
		return json.RawMessage(`{"difficulty":4,"prefix":"ab"}`), nil
	}
	return nil, nil
}

func (g shadowGuard) Shadows(rule string) bool { return g.rules[rule] }
func (g shadowGuard) ShadowRisk() float64      { return g.risk }

func (e *env) riskToken(user int64, risk float64) string {
	e.t.Helper()
	tok, err := auth.MintWith(jwtSecret, user, auth.MintOptions{Risk: &risk}, time.Hour, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// TestShadowQueue: shoppers a shadow rule judges (the blocklist, a risk
// claim over the threshold, a second account of an identity key) wait on
// a page like anyone's, with a place that moves with the cursor, and are
// never admitted, while the queue admits everyone else past them; they
// hold no ticket of the queue. A shadowed shopper who comes back with a
// clean token stays shadowed; the polling status says the same. The
// console's list counts them by rule; a released one is closed with
// "going away", joins again as anyone and is admitted.
func TestShadowQueue(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 31, e.clock.Now().Add(time.Second), 100, 100))
	guard := shadowGuard{blocked: map[int64]bool{101: true},
		rules: map[string]bool{ShadowIdentity: true}, risk: 0.8}
	g := e.newGateway(Config{}, guard)
	ctx := context.Background()

	var real []*client
	for u := int64(1); u <= 10; u++ {
		c := dial(t, g.url(sale.ID))
		if u == 1 {
			c.join(e.identityToken(u, "card-1"))
		} else {
			c.join(e.token(u))
		}
		c.untilState(StatePrequeue)
		real = append(real, c)
	}
	blocked := dial(t, g.url(sale.ID))
	blocked.join(e.token(101))
	risky := dial(t, g.url(sale.ID))
	risky.join(e.riskToken(102, 0.9))
	twin := dial(t, g.url(sale.ID))
	twin.join(e.identityToken(103, "card-1"))
	shadows := []*client{blocked, risky, twin}
	for _, c := range shadows {
		c.untilState(StatePrequeue)
	}
	// A risk claim at the threshold is not above it.
	calm := dial(t, g.url(sale.ID))
	calm.join(e.riskToken(11, 0.8))
	calm.untilState(StatePrequeue)
	real = append(real, calm)

	q, err := g.room.ShadowList(ctx, sale.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	if q.Shadowed != 3 || q.ByRule[ShadowBlocklist] != 1 || q.ByRule[ShadowRisk] != 1 || q.ByRule[ShadowIdentity] != 1 || len(q.Shoppers) != 3 {
		t.Fatalf("shadow list %+v: want users 101, 102, 103 by blocklist, risk, identity", q)
	}
	for _, u := range []string{"101", "102", "103"} {
		if e.rdb.HExists(ctx, lua.QueueKey(sale.ID, keyTickets), u).Val() {
			t.Fatalf("shadowed user %s holds a ticket of the queue", u)
		}
	}
	if n := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyTickets)).Val(); n != 11 {
		t.Fatalf("queue holds %d tickets, want the 11 real shoppers'", n)
	}

	// The opening: every real shopper is admitted (rate 100/s over 2 s of
	// the clock); the shadows wait, their places moving with the cursor.
	e.clock.Advance(3 * time.Second)
	for i, c := range real {
		if m := c.untilAdmitted(); m.AdmissionToken == "" {
			t.Fatalf("real shopper %d: admitted without a token: %+v", i+1, m)
		}
	}
	// A shadow's messages up to its WAITING status: never an admission.
	waiting := func(i int, c *client) msg {
		t.Helper()
		return c.until("WAITING", hangBound, func(m msg) bool {
			if m.Type == TypeAdmitted || m.State == StateAdmitted || m.AdmissionToken != "" {
				t.Fatalf("shadow %d was admitted: %+v", i, m)
			}
			return m.Type == TypeStatus && m.State == StateWaiting
		})
	}
	for i, c := range shadows {
		if m := waiting(i, c); m.Position < 3 || m.EtaSeconds <= 0 {
			t.Fatalf("shadow %d: %+v: want a waiting place a few behind the cursor, with an ETA", i, m)
		}
	}
	e.clock.Advance(2 * time.Second)
	g.waitTicks(t, 20)
	if f, err := g.room.Figures(ctx, sale.ID); err != nil || f.Admitted < 11 {
		t.Fatalf("figures %+v %v: want the 11 real shoppers admitted", f, err)
	}
	for _, u := range []string{"101", "102", "103"} {
		if e.rdb.HExists(ctx, lua.QueueKey(sale.ID, keyAdmitted), u).Val() {
			t.Fatalf("shadowed user %s has an admission record", u)
		}
	}
	sr := g.room.saleRoom(sale.ID, false)
	sr.mu.Lock()
	for c := range sr.conns {
		if c.user > 100 && c.user < 104 && (!c.shadow || c.admittedAt != 0 || c.last.state != StateWaiting) {
			t.Errorf("shadow %d's connection: shadow %v, admitted at %d, last state %s", c.user, c.shadow, c.admittedAt, c.last.state)
		}
	}
	sr.mu.Unlock()

	// Back with a clean token: still shadowed, the same answer.
	again := dial(t, g.url(sale.ID))
	again.join(e.token(102))
	if m := again.untilState(StateWaiting); m.AdmissionToken != "" {
		t.Fatalf("a shadow back with a clean token: %+v", m)
	}
	st, err := g.room.Status(ctx, flashsale.Principal{UserID: 101}, sale.ID)
	if err != nil || st.State != StateWaiting || st.AdmissionToken != "" || st.Position < 3 {
		t.Fatalf("polling status of a shadow: %+v %v", st, err)
	}
	st, err = g.room.Join(ctx, flashsale.Principal{UserID: 102}, sale.ID, testIP, nil, "")
	if err != nil || st.State != StateWaiting || st.AdmissionToken != "" {
		t.Fatalf("polling join of a shadow: %+v %v", st, err)
	}

	// Released: the page is closed, joins again and is admitted.
	if err := g.room.ReleaseShadowed(ctx, sale.ID, 102); err != nil {
		t.Fatal(err)
	}
	if err := g.room.ReleaseShadowed(ctx, sale.ID, 102); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("release twice: %v, want NOT_FOUND", err)
	}
	e.clock.Advance(shadowCheckEvery)
	for _, c := range []*client{risky, again} {
		c.expectClose(t, "", websocket.StatusGoingAway)
	}
	blocked.untilState(StateWaiting) // the others stay
	back := dial(t, g.url(sale.ID))
	back.join(e.riskToken(102, 0.9))
	// In the queue (its first answer) before the clock gives the cursor
	// room: a tick between the clock's step and the join would spend
	// the credit on places nobody holds yet.
	m := back.until("the rejoin's answer", hangBound, func(m msg) bool { return m.Type == TypeStatus || m.Type == TypeAdmitted })
	if m.Type != TypeAdmitted {
		e.clock.Advance(time.Second)
		m = back.untilAdmitted()
	}
	if m.AdmissionToken == "" {
		t.Fatalf("released shopper: %+v", m)
	}
	q, err = g.room.ShadowList(ctx, sale.ID, 10)
	if err != nil || q.Shadowed != 2 || q.Released != 1 {
		t.Fatalf("after the release: %+v %v", q, err)
	}
	if !e.rdb.HExists(ctx, lua.QueueKey(sale.ID, keyTickets), strconv.Itoa(102)).Val() {
		t.Fatal("the released shopper holds no ticket")
	}
}

// TestShadowOverCapAndSkippedPow: with the perAddress rule, a WebSocket
// over the per-address cap is shadowed rather than refused, up to
// shadowCapFactor times the cap, then refused RATE_LIMITED; with the pow
// rule, a shopper challenged once who joins again without a solution is
// shadowed rather than challenged again.
func TestShadowOverCapAndSkippedPow(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 32, e.clock.Now().Add(time.Minute), 100, 100))
	guard := shadowGuard{rules: map[string]bool{ShadowPerAddress: true, ShadowPow: true},
		challenged: map[int64]bool{50: true}}
	g := e.newGateway(Config{MaxConnsPerIP: 2}, guard)
	ctx := context.Background()

	for u := int64(1); u <= 2*shadowCapFactor; u++ {
		c := dial(t, g.url(sale.ID))
		c.join(e.token(u))
		c.untilState(StatePrequeue)
	}
	if _, _, err := websocket.Dial(ctx, g.url(sale.ID), nil); err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("a WebSocket past %d times the cap: %v, want 429", shadowCapFactor, err)
	}
	q, err := g.room.ShadowList(ctx, sale.ID, 100)
	if err != nil || q.Shadowed != 2*shadowCapFactor-2 || q.ByRule[ShadowPerAddress] != 2*shadowCapFactor-2 {
		t.Fatalf("shadow list %+v %v: want the %d sockets over the cap of 2", q, err, 2*shadowCapFactor-2)
	}
	if n := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyTickets)).Val(); n != 2 {
		t.Fatalf("queue holds %d tickets, want the 2 within the cap", n)
	}

	g2 := e.newGateway(Config{}, guard)
	c := dial(t, g2.url(sale.ID))
	c.join(e.token(50))
	if m := c.until("challenge", hangBound, func(m msg) bool { return m.Type != "" }); m.Type != TypeChallenge {
		t.Fatalf("first join: %+v, want a challenge", m)
	}
	c.join(e.token(50))
	c.untilState(StatePrequeue)
	q, err = g.room.ShadowList(ctx, sale.ID, 100)
	if err != nil || q.ByRule[ShadowPow] != 1 {
		t.Fatalf("shadow list %+v %v: want user 50 by pow", q, err)
	}
}

// TestShadowedConnectionNotRestored: Redis loses a queue that a shadowed
// shopper's page is waiting in; the gateway's restore brings back its
// real shoppers' tickets and not the shadowed page's shown ticket, which
// is no place of the queue.
func TestShadowedConnectionNotRestored(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 33, e.clock.Now().Add(time.Hour), 100, 100))
	g := e.newGateway(Config{}, shadowGuard{blocked: map[int64]bool{101: true}})
	ctx := context.Background()
	for u := int64(1); u <= 5; u++ {
		c := dial(t, g.url(sale.ID))
		c.join(e.token(u))
		c.untilState(StatePrequeue)
	}
	shadow := dial(t, g.url(sale.ID))
	shadow.join(e.token(101))
	shadow.untilState(StatePrequeue)
	if e.rdb.HExists(ctx, lua.QueueKey(sale.ID, keyTickets), "101").Val() {
		t.Fatal("the shadowed user holds a ticket before the loss")
	}

	if err := testenv.Flush(ctx, e.rdb); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the queue restored", 10*time.Second, func() bool {
		return e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyState), "live").Val() == "1" &&
			e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyTickets)).Val() >= 5
	})
	if n := e.rdb.HLen(ctx, lua.QueueKey(sale.ID, keyTickets)).Val(); n != 5 {
		t.Fatalf("the restored queue holds %d tickets, want the 5 real shoppers'", n)
	}
	if e.rdb.HExists(ctx, lua.QueueKey(sale.ID, keyTickets), "101").Val() {
		t.Fatal("the restore gave the shadowed user a ticket")
	}
	if n := e.rdb.LLen(ctx, lua.QueueKey(sale.ID, keyOrder)).Val(); n != 5 {
		t.Fatalf("the restored order holds %d tickets, want the 5 real shoppers'", n)
	}
}
