package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// wsShopper is a shopper connected to the waiting room over a WebSocket;
// every message it receives is kept, in order.
type wsShopper struct {
	t    *testing.T
	mu   sync.Mutex
	msgs []map[string]any
	raw  []string
	wake chan struct{}
}

func joinWS(t *testing.T, s *stack, saleID, user int64) *wsShopper {
	t.Helper()
	return joinWSToken(t, s, saleID, s.Token(user, false))
}

// joinWSToken is joinWS with the given access token. When the server
// closes the socket, a message {"type": "closed", "status": <close
// status>} is recorded.
func joinWSToken(t *testing.T, s *stack, saleID int64, token string) *wsShopper {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, _, err := websocket.Dial(dctx, url, nil)
	if err != nil {
		cancel()
		t.Fatalf("dial: %v", err)
	}
	msg, _ := json.Marshal(map[string]string{"type": "join", "accessToken": token})
	if err := c.Write(dctx, websocket.MessageText, msg); err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &wsShopper{t: t, wake: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				w.mu.Lock()
				w.msgs = append(w.msgs, map[string]any{"type": "closed", "status": float64(websocket.CloseStatus(err))})
				w.mu.Unlock()
				select {
				case w.wake <- struct{}{}:
				default:
				}
				return
			}
			var m map[string]any
			_ = json.Unmarshal(data, &m)
			w.mu.Lock()
			w.msgs, w.raw = append(w.msgs, m), append(w.raw, string(data))
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = c.CloseNow()
		<-done
	})
	return w
}

// waitFor waits (up to a deadline that only guards against a hang) for a
// message that pred accepts and returns its index.
func (w *wsShopper) waitFor(what string, pred func(m map[string]any) bool) int {
	w.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		w.mu.Lock()
		for i, m := range w.msgs {
			if pred(m) {
				w.mu.Unlock()
				return i
			}
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-deadline:
			w.mu.Lock()
			defer w.mu.Unlock()
			w.t.Fatalf("no %s within 20s; got %v", what, w.raw)
		}
	}
}

func (w *wsShopper) count(pred func(m map[string]any) bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if pred(m) {
			n++
		}
	}
	return n
}

func isState(state string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["type"] == "status" && m["state"] == state }
}

func isType(typ string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["type"] == typ }
}

// createSaleAt creates a sale through the operator API with the given
// admission rate and items (quantities) and returns its id and item ids.
func (s *stack) createSaleWith(rate int, quantities ...int) (int64, []int64) {
	s.T.Helper()
	var items []map[string]any
	for i, q := range quantities {
		items = append(items, map[string]any{"productId": 500 + i, "quantity": q, "priceCents": 1999,
			"name": fmt.Sprintf("Sneaker %d", i), "currency": "EUR", "imageUrl": "/assets/sneaker.svg"})
	}
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "controls", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"admissionRatePerSecond": rate, "items": items, "allocation": "race",
	})
	s.Want(r, 201, "")
	var ids []int64
	for _, it := range r.Body["items"].([]any) {
		ids = append(ids, int64(it.(map[string]any)["id"].(float64)))
	}
	return int64(r.Body["id"].(float64)), ids
}

// waitSale waits until this gateway's sale cache has the sale.
func (s *stack) waitSale(saleID int64) {
	s.T.Helper()
	path := fmt.Sprintf("/api/flash-sales/sales/%d", saleID)
	testenv.Eventually(s.T, fmt.Sprintf("sale %d on this gateway", saleID), 10*time.Second, func() bool {
		return s.Do("GET", path, "", nil).Status == 200
	})
}

func (s *stack) control(saleID int64, action string, body any, hdr ...string) apptest.Resp {
	s.T.Helper()
	return s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/%s", saleID, action), s.Token(1, true), body, hdr...)
}

func auditActions(t *testing.T, s *stack) map[string]int {
	t.Helper()
	r := s.Do("GET", "/api/admin/audit?limit=1000", s.Token(1, true), nil)
	s.Want(r, 200, "")
	var entries []struct{ Action string }
	if err := json.Unmarshal(r.Raw, &entries); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range entries {
		out[e.Action]++
	}
	return out
}

// Pause: a waiting shopper (on the other gateway) is told PAUSED, nobody
// is admitted, a purchase with a valid admission token is refused 409
// SALE_PAUSED on both gateways and reserves nothing. Resume: the waiting
// shopper is admitted and the held token buys.
func TestPauseResumeThroughHTTP(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	a, b := twoGateways(t)
	saleID, items := a.createSaleWith(10000, 5)
	held := a.admit(100, saleID)
	b.waitSale(saleID)

	r := a.control(saleID, "pause", nil)
	a.Want(r, 200, "")
	if r.Body["state"] != "PAUSED" || r.Body["paused"] != true || r.Header.Get("ETag") != `"2"` {
		t.Fatalf("pause answered %s (ETag %s)", r.Raw, r.Header.Get("ETag"))
	}
	// The other gateway's cache follows the announcement.
	var pub apptest.Resp
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("PAUSED in the second gateway's sale data (last %s)", pub.Raw) }, 2*time.Second, func() bool {
		pub = b.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil)
		return pub.Body["state"] == "PAUSED"
	})
	waiting := joinWS(t, b, saleID, 101)
	waiting.waitFor("PAUSED status", isState("PAUSED"))

	// Refused on both gateways, before any reservation.
	for _, g := range []*stack{a, b} {
		var p apptest.Resp
		testenv.Wait(2*time.Second, func() bool { p = g.purchase(100, items[0], held); return p.Status == 409 })
		g.Want(p, 409, "SALE_PAUSED")
		if !strings.Contains(p.Body["message"].(string), "keep your place") {
			t.Errorf("message %q", p.Body["message"])
		}
	}
	// A witness sale that is not paused: its shoppers are admitted by the
	// same ticks that would move the paused sale's cursor, so once two of
	// them are in, those ticks have run.
	witness, _ := a.createSaleWith(10000, 5)
	a.admit(200, witness)
	a.admit(201, witness)
	fig := a.figures(saleID)
	if got := itemFigure(t, fig, items[0], "remaining"); got != 5 {
		t.Fatalf("remaining %d after refused purchases, want 5", got)
	}
	if q := fig["queue"].(map[string]any); q["admitted"].(float64) != 1 {
		t.Fatalf("queue %v while paused, want 1 admitted", q)
	}
	if n := waiting.count(isType("admitted")); n != 0 {
		t.Fatalf("%d admissions while paused", n)
	}

	// Pausing again is harmless: no new version.
	again := a.control(saleID, "pause", map[string]any{})
	a.Want(again, 200, "")
	if again.Body["version"].(float64) != 2 {
		t.Fatalf("second pause bumped the version: %s", again.Raw)
	}

	r = a.control(saleID, "resume", nil)
	a.Want(r, 200, "")
	if r.Body["state"] != "OPEN" || r.Body["version"].(float64) != 3 {
		t.Fatalf("resume answered %s", r.Raw)
	}
	waiting.waitFor("admission after the resume", isType("admitted"))
	var p apptest.Resp
	testenv.Wait(10*time.Second, func() bool { p = b.purchase(100, items[0], held); return p.Status != 409 })
	b.Want(p, 202, "")
	acts := auditActions(t, a)
	if acts["sale.pause"] != 1 || acts["sale.resume"] != 1 {
		t.Fatalf("audit %v, want one pause and one resume", acts)
	}
}

// End now: connected shoppers are told ENDED, purchases are refused, and
// a PENDING order keeps its payment window.
func TestEndNowThroughHTTP(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSaleWith(10000, 5)
	buyer := s.admit(100, saleID)
	r := s.purchase(100, items[0], buyer)
	s.Want(r, 202, "")
	orderID := r.Body["orderId"].(string)
	s.waitPayable(100, orderID)
	late := s.admit(101, saleID)
	ws := joinWS(t, s, saleID, 102)
	ws.waitFor("a first status", isType("status"))

	r = s.control(saleID, "end", nil)
	s.Want(r, 200, "")
	if r.Body["state"] != "ENDED" || r.Body["endsAt"] == nil {
		t.Fatalf("end answered %s", r.Raw)
	}
	ws.waitFor("ENDED status", isState("ENDED"))
	s.Want(s.purchase(101, items[0], late), 403, "NOT_ADMITTED")
	pay := s.Do("POST", "/api/flash-sales/orders/"+orderID+"/pay", s.Token(100, false), nil)
	s.Want(pay, 200, "")
	if pay.Body["status"] != "PAID" {
		t.Fatalf("pay after the end: %s", pay.Raw)
	}
	again := s.control(saleID, "end", nil)
	s.Want(again, 200, "")
	if again.Body["version"] != r.Body["version"] {
		t.Fatalf("ending an ended sale bumped the version: %s", again.Raw)
	}
	if acts := auditActions(t, s); acts["sale.end"] != 1 {
		t.Fatalf("audit %v, want one sale.end", acts)
	}
}

// Stock added to a sold-out sale: the sold-out answer stops, shoppers are
// admitted again and buy exactly the units added; sold + remaining =
// quantity.
func TestAddStockToSoldOutSale(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSaleWith(10000, 1)
	item := items[0]
	t100, t101 := s.admit(100, saleID), s.admit(101, saleID)
	s.Want(s.purchase(100, item, t100), 202, "")
	s.Want(s.purchase(101, item, t101), 410, "SOLD_OUT")
	s.Want(s.purchase(101, item, t101), 410, "SOLD_OUT") // the local flag's answer
	path := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	s.Want(s.Do("POST", path, s.Token(102, false), nil), 200, "")

	r := s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/items/%d/stock", saleID, item), s.Token(1, true), map[string]any{"add": 2})
	s.Want(r, 200, "")
	if q := r.Body["items"].([]any)[0].(map[string]any)["quantity"].(float64); q != 3 {
		t.Fatalf("quantity %v after adding 2, want 3", q)
	}
	// The flag clears; the held token buys.
	var p apptest.Resp
	testenv.Wait(10*time.Second, func() bool { p = s.purchase(101, item, t101); return p.Status != 410 })
	s.Want(p, 202, "")
	// The room admits the next shopper, who buys the last unit added.
	s.Want(s.purchase(102, item, s.admit(102, saleID)), 202, "")
	s.Want(s.Do("POST", path, s.Token(103, false), nil), 200, "")
	var st apptest.Resp
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the fourth shopper to see SOLD_OUT (last %s)", st.Raw) }, 10*time.Second, func() bool {
		st = s.Do("GET", path, s.Token(103, false), nil)
		return st.Body["state"] == "SOLD_OUT"
	})
	// Every order reaches the database: sold + remaining = quantity.
	var sold, rem int64
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("sold 3, remaining 0 (quantity 3; now %d and %d)", sold, rem) }, 15*time.Second, func() bool {
		fig := s.figures(saleID)
		sold, rem = itemFigure(t, fig, item, "sold"), itemFigure(t, fig, item, "remaining")
		return sold == 3 && rem == 0
	})
	if acts := auditActions(t, s); acts["sale.stock"] != 1 {
		t.Fatalf("audit %v, want one sale.stock", acts)
	}
}

// A message reaches a shopper on each gateway at once, a shopper who joins
// later after the first status, the polling status and the public sale
// data; clearing it is announced too.
func TestMessageReachesEveryGateway(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	a, b := twoGateways(t)
	saleID, _ := a.createSaleWith(10000, 5)
	b.waitSale(saleID)
	onA, onB := joinWS(t, a, saleID, 100), joinWS(t, b, saleID, 101)
	onA.waitFor("a first status", isType("status"))
	onB.waitFor("a first status", isType("status"))
	text := "  Restock at 19:00 · reposición a las 19:00  "
	r := a.control(saleID, "message", map[string]any{"text": text})
	a.Want(r, 200, "")
	want := strings.TrimSpace(text)
	msg, ok := r.Body["message"].(map[string]any)
	if !ok || msg["text"] != want {
		t.Fatalf("message answered %s", r.Raw)
	}
	isMsg := func(m map[string]any) bool {
		return m["type"] == "message" && m["text"] == want && m["atMs"] == msg["atMs"]
	}
	onA.waitFor("the message on gateway a", isMsg)
	onB.waitFor("the message on gateway b", isMsg)
	late := joinWS(t, b, saleID, 102)
	first, got := late.waitFor("a first status", isType("status")), late.waitFor("the message", isMsg)
	if got < first {
		t.Fatalf("the late joiner got the message before its first status: %v", late.raw)
	}
	pub := b.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil)
	if m, _ := pub.Body["message"].(map[string]any); m["text"] != want {
		t.Fatalf("public sale data %s", pub.Raw)
	}
	path := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	a.Want(a.Do("POST", path, a.Token(103, false), nil), 200, "")
	poll := a.Do("GET", path, a.Token(103, false), nil)
	if m, _ := poll.Body["message"].(map[string]any); m["text"] != want {
		t.Fatalf("polling status %s", poll.Raw)
	}

	a.Want(a.control(saleID, "message", map[string]any{"text": ""}), 200, "")
	onB.waitFor("the clearing", func(m map[string]any) bool { return m["type"] == "message" && m["text"] == "" })
	if pub := a.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil); pub.Body["message"] != nil {
		t.Fatalf("cleared message still in %s", pub.Raw)
	}
	if acts := auditActions(t, a); acts["sale.message"] != 2 {
		t.Fatalf("audit %v, want two sale.message", acts)
	}
}

// A write with a stale If-Match gets 412 with the current state and
// changes nothing; of two writes naming one version exactly one applies.
// The settings the same.
func TestIfMatchThroughHTTP(t *testing.T) {
	s := startStack(t)
	saleID, _ := s.createSaleWith(10000, 5)
	op := s.Token(1, true)
	sale := fmt.Sprintf("/api/admin/sales/%d", saleID)
	g := s.Do("GET", sale, op, nil)
	s.Want(g, 200, "")
	if g.Header.Get("ETag") != `"1"` || g.Body["version"].(float64) != 1 {
		t.Fatalf("GET: ETag %q, body %s", g.Header.Get("ETag"), g.Raw)
	}
	r := s.Do("PATCH", sale, op, map[string]any{"name": "renamed"}, "If-Match", `"1"`)
	s.Want(r, 200, "")
	if r.Header.Get("ETag") != `"2"` {
		t.Fatalf("PATCH ETag %q", r.Header.Get("ETag"))
	}
	for _, h := range []string{`"1"`, "1", `"0"`} {
		stale := s.Do("PATCH", sale, op, map[string]any{"name": "overwritten"}, "If-Match", h)
		s.Want(stale, 412, "VERSION_CONFLICT")
		cur, _ := stale.Body["current"].(map[string]any)
		if cur["name"] != "renamed" || cur["version"].(float64) != 2 || stale.Header.Get("ETag") != `"2"` {
			t.Fatalf("412 for If-Match %s: %s", h, stale.Raw)
		}
	}
	s.Want(s.control(saleID, "pause", nil, "If-Match", `"1"`), 412, "VERSION_CONFLICT")
	if g := s.Do("GET", sale, op, nil); g.Body["name"] != "renamed" || g.Body["paused"] != false || g.Body["version"].(float64) != 2 {
		t.Fatalf("a refused write changed the sale: %s", g.Raw)
	}

	race := func(do func() apptest.Resp) (ok, conflict int) {
		var wg sync.WaitGroup
		res := make([]apptest.Resp, 2)
		for i := range res {
			wg.Go(func() { res[i] = do() })
		}
		wg.Wait()
		for _, r := range res {
			switch {
			case r.Status == 200:
				ok++
			case r.Status == 412 && r.Body["error"] == "VERSION_CONFLICT":
				conflict++
			default:
				t.Fatalf("racing write answered %d %s", r.Status, r.Raw)
			}
		}
		return ok, conflict
	}
	if ok, c := race(func() apptest.Resp {
		return s.control(saleID, "message", map[string]any{"text": "hi"}, "If-Match", `"2"`)
	}); ok != 1 || c != 1 {
		t.Fatalf("two writes with one version: %d applied, %d refused; want 1 and 1", ok, c)
	}

	// Settings.
	st := s.Do("GET", "/api/admin/settings", op, nil)
	s.Want(st, 200, "")
	v := int64(st.Body["version"].(float64))
	if st.Header.Get("ETag") != fmt.Sprintf(`"%d"`, v) {
		t.Fatalf("settings ETag %q, version %d", st.Header.Get("ETag"), v)
	}
	put := s.Do("PUT", "/api/admin/settings", op, apptest.Permissive, "If-Match", fmt.Sprint(v))
	s.Want(put, 200, "")
	if put.Header.Get("ETag") != fmt.Sprintf(`"%d"`, v+1) {
		t.Fatalf("PUT ETag %q, want %d", put.Header.Get("ETag"), v+1)
	}
	stale := s.Do("PUT", "/api/admin/settings", op, apptest.Permissive, "If-Match", fmt.Sprintf(`"%d"`, v))
	s.Want(stale, 412, "VERSION_CONFLICT")
	if cur, _ := stale.Body["current"].(map[string]any); cur["version"].(float64) != float64(v+1) {
		t.Fatalf("settings 412: %s", stale.Raw)
	}
	if ok, c := race(func() apptest.Resp {
		return s.Do("PUT", "/api/admin/settings", op, apptest.Permissive, "If-Match", fmt.Sprintf(`"%d"`, v+1))
	}); ok != 1 || c != 1 {
		t.Fatalf("two settings writes with one version: %d applied, %d refused", ok, c)
	}
	s.Want(s.Do("PUT", "/api/admin/settings", op, apptest.Permissive, "If-Match", "W/\"3\""), 400, "INVALID")
}

// Bad input on every control: the contract's code, a message naming what
// is wrong, and nothing changed.
func TestControlsBadInput(t *testing.T) {
	s := startStack(t)
	saleID, items := s.createSaleWith(10000, 5)
	_, otherItems := s.createSaleWith(10000, 5)
	op := s.Token(1, true)
	stock := fmt.Sprintf("/api/admin/sales/%d/items/%d/stock", saleID, items[0])
	before := auditActions(t, s)
	cases := []struct {
		name, method, path string
		token              string
		body               any
		hdr                []string
		status             int
		code, inMessage    string
	}{
		{"bad sale id", "POST", "/api/admin/sales/abc/pause", op, nil, nil, 400, "INVALID", "sale id"},
		{"zero sale id", "POST", "/api/admin/sales/0/resume", op, nil, nil, 400, "INVALID", "sale id"},
		{"unknown sale", "POST", "/api/admin/sales/999999/pause", op, nil, nil, 404, "NOT_FOUND", "sale"},
		{"unknown sale end", "POST", "/api/admin/sales/999999/end", op, nil, nil, 404, "NOT_FOUND", "sale"},
		{"shopper token", "POST", fmt.Sprintf("/api/admin/sales/%d/pause", saleID), s.Token(5, false), nil, nil, 403, "FORBIDDEN", "operator"},
		{"no token", "POST", fmt.Sprintf("/api/admin/sales/%d/end", saleID), "", nil, nil, 401, "UNAUTHENTICATED", ""},
		{"pause with a field", "POST", fmt.Sprintf("/api/admin/sales/%d/pause", saleID), op, `{"now":true}`, nil, 400, "INVALID", "now"},
		{"pause with bad JSON", "POST", fmt.Sprintf("/api/admin/sales/%d/pause", saleID), op, `{`, nil, 400, "INVALID", "JSON"},
		{"bad If-Match", "POST", fmt.Sprintf("/api/admin/sales/%d/pause", saleID), op, nil, []string{"If-Match", "abc"}, 400, "INVALID", "If-Match"},
		{"weak If-Match", "POST", fmt.Sprintf("/api/admin/sales/%d/end", saleID), op, nil, []string{"If-Match", `W/"1"`}, 400, "INVALID", "If-Match"},
		{"stock bad JSON", "POST", stock, op, `{"add":`, nil, 400, "INVALID", "JSON"},
		{"stock no body", "POST", stock, op, nil, nil, 400, "INVALID", "body"},
		{"stock add missing", "POST", stock, op, map[string]any{}, nil, 400, "INVALID", "add"},
		{"stock add zero", "POST", stock, op, map[string]any{"add": 0}, nil, 400, "INVALID", "add"},
		{"stock add negative", "POST", stock, op, map[string]any{"add": -3}, nil, 400, "INVALID", "add"},
		{"stock add too big", "POST", stock, op, map[string]any{"add": 1_000_001}, nil, 400, "INVALID", "add"},
		{"stock add fraction", "POST", stock, op, `{"add": 1.5}`, nil, 400, "INVALID", "add"},
		{"stock add string", "POST", stock, op, `{"add": "5"}`, nil, 400, "INVALID", "add"},
		{"stock unknown field", "POST", stock, op, `{"add": 1, "item": 2}`, nil, 400, "INVALID", "item"},
		{"stock bad item id", "POST", fmt.Sprintf("/api/admin/sales/%d/items/x1/stock", saleID), op, map[string]any{"add": 1}, nil, 400, "INVALID", "item id"},
		{"stock item of another sale", "POST", fmt.Sprintf("/api/admin/sales/%d/items/%d/stock", saleID, otherItems[0]), op, map[string]any{"add": 1}, nil, 404, "NOT_FOUND", "item"},
		{"stock unknown item", "POST", fmt.Sprintf("/api/admin/sales/%d/items/999999/stock", saleID), op, map[string]any{"add": 1}, nil, 404, "NOT_FOUND", "item"},
		{"stock bad If-Match", "POST", stock, op, map[string]any{"add": 1}, []string{"If-Match", `"1", "2"`}, 400, "INVALID", "If-Match"},
		{"message too long", "POST", fmt.Sprintf("/api/admin/sales/%d/message", saleID), op, map[string]any{"text": strings.Repeat("é", 281)}, nil, 400, "INVALID", "text"},
		{"message missing", "POST", fmt.Sprintf("/api/admin/sales/%d/message", saleID), op, map[string]any{}, nil, 400, "INVALID", "text"},
		{"message not a string", "POST", fmt.Sprintf("/api/admin/sales/%d/message", saleID), op, `{"text": 5}`, nil, 400, "INVALID", "text"},
		{"message control character", "POST", fmt.Sprintf("/api/admin/sales/%d/message", saleID), op, map[string]any{"text": "a\u0007b"}, nil, 400, "INVALID", "text"},
		{"message array body", "POST", fmt.Sprintf("/api/admin/sales/%d/message", saleID), op, `["hi"]`, nil, 400, "INVALID", "object"},
		{"create bad image", "POST", "/api/admin/sales", op, map[string]any{"name": "x", "startsAt": "2026-12-01T18:00:00Z", "admissionRatePerSecond": 1,
			"items": []any{map[string]any{"productId": 1, "quantity": 1, "priceCents": 1, "imageUrl": "javascript:alert(1)"}}}, nil, 400, "INVALID", "items[0].imageUrl"},
		{"create bad currency", "POST", "/api/admin/sales", op, map[string]any{"name": "x", "startsAt": "2026-12-01T18:00:00Z", "admissionRatePerSecond": 1,
			"items": []any{map[string]any{"productId": 1, "quantity": 1, "priceCents": 1, "currency": "eur"}}}, nil, 400, "INVALID", "items[0].currency"},
		{"create long name", "POST", "/api/admin/sales", op, map[string]any{"name": "x", "startsAt": "2026-12-01T18:00:00Z", "admissionRatePerSecond": 1,
			"items": []any{map[string]any{"productId": 1, "quantity": 1, "priceCents": 1, "name": strings.Repeat("n", 201)}}}, nil, 400, "INVALID", "items[0].name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := s.Do(tc.method, tc.path, tc.token, tc.body, tc.hdr...)
			if r.Status != tc.status || r.Body["error"] != tc.code {
				t.Fatalf("%d %s, want %d %s", r.Status, r.Raw, tc.status, tc.code)
			}
			if msg, _ := r.Body["message"].(string); !strings.Contains(msg, tc.inMessage) {
				t.Fatalf("message %q does not name %q", msg, tc.inMessage)
			}
		})
	}
	g := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), op, nil)
	if g.Body["version"].(float64) != 1 || g.Body["paused"] != false || g.Body["message"] != nil || g.Body["endsAt"] != nil ||
		itemFigure(t, g.Body, items[0], "quantity") != 5 || itemFigure(t, g.Body, items[0], "remaining") != 5 {
		t.Fatalf("bad input changed the sale: %s", g.Raw)
	}
	if after := auditActions(t, s); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("bad input wrote audit rows: %v, before %v", after, before)
	}
}

// TestOpenAPIControls checks the sale controls, versions and item details
// against docs/openapi.yaml: every request and answer, the 412 bodies, the
// PAUSED statuses and the WebSocket message.
func TestOpenAPIControls(t *testing.T) {
	s := apptest.Start(t)
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
		"name": "openapi controls", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"admissionRatePerSecond": 10000, "allocation": "race",
		"items": []map[string]any{
			{"productId": 501, "quantity": 1, "priceCents": 1999, "name": "Trail runner", "currency": "EUR", "imageUrl": "/assets/sneaker.svg"},
			{"productId": 502, "quantity": 5, "priceCents": 2999},
		},
	})
	c.s.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	item := int64(created.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	salePath := fmt.Sprintf("/api/admin/sales/%d", saleID)
	public := fmt.Sprintf("/api/flash-sales/sales/%d", saleID)
	queue := public + "/queue"
	ctl := func(action string, body any, hdr ...string) apptest.Resp {
		return c.call(false, "POST", salePath+"/"+action, op, body, hdr...)
	}
	held := c.admitted(100, saleID)

	c.s.Want(ctl("pause", nil, "If-Match", `"1"`), 200, "")
	c.s.Want(ctl("pause", map[string]any{}), 200, "")
	if g := c.call(false, "GET", public, "", nil); g.Body["state"] != "PAUSED" {
		t.Fatalf("public sale %s, want PAUSED", g.Raw)
	}
	c.s.Want(c.call(false, "POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", item), s.Token(100, false), nil, "X-Admission-Token", held), 409, "SALE_PAUSED")
	c.s.Want(c.call(false, "POST", queue, s.Token(101, false), nil), 200, "")
	if st := c.call(false, "GET", queue, s.Token(101, false), nil); st.Body["state"] != "PAUSED" {
		t.Fatalf("polling status %s, want PAUSED", st.Raw)
	}
	c.s.Want(ctl("resume", nil, "If-Match", "2"), 200, "")
	c.s.Want(ctl("message", map[string]any{"text": "Restock at 19:00"}), 200, "")
	c.s.Want(c.call(false, "GET", public, "", nil), 200, "")
	c.s.Want(c.call(false, "GET", queue, s.Token(101, false), nil), 200, "")
	if got := c.wsJoin(saleID, map[string]string{"type": "join", "accessToken": s.Token(102, false)}, "message"); got[0] != "status" {
		t.Fatalf("WebSocket messages %v, want a status first", got)
	}
	c.s.Want(c.call(false, "POST", fmt.Sprintf("%s/items/%d/stock", salePath, item), op, map[string]any{"add": 3}), 200, "")
	c.s.Want(c.call(false, "PATCH", salePath, op, map[string]any{"name": "stale"}, "If-Match", `"1"`), 412, "VERSION_CONFLICT")
	c.s.Want(ctl("end", nil, "If-Match", `"2"`), 412, "VERSION_CONFLICT")
	c.s.Want(c.callInvalid("POST", salePath+"/end", op, nil, "If-Match", "abc"), 400, "INVALID")
	c.s.Want(c.callInvalid("POST", fmt.Sprintf("%s/items/%d/stock", salePath, item), op, map[string]any{"add": 0}), 400, "INVALID")
	c.s.Want(c.callInvalid("POST", salePath+"/message", op, map[string]any{"text": strings.Repeat("x", 281)}), 400, "INVALID")
	c.s.Want(c.call(false, "POST", "/api/admin/sales/987654/pause", op, nil), 404, "NOT_FOUND")
	c.s.Want(ctl("end", nil), 200, "")
	c.s.Want(c.call(false, "GET", salePath, op, nil), 200, "")

	st := c.call(false, "GET", "/api/admin/settings", op, nil)
	c.s.Want(st, 200, "")
	var permissive map[string]any
	if err := json.Unmarshal([]byte(apptest.Permissive), &permissive); err != nil {
		t.Fatal(err)
	}
	v := st.Header.Get("ETag")
	c.s.Want(c.call(false, "PUT", "/api/admin/settings", op, permissive, "If-Match", v), 200, "")
	c.s.Want(c.call(false, "PUT", "/api/admin/settings", op, permissive, "If-Match", v), 412, "VERSION_CONFLICT")
	c.s.Want(c.call(false, "GET", "/api/admin/audit?limit=50", op, nil), 200, "")
}
