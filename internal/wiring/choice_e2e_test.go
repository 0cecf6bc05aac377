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

	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// choiceWS is a shopper on the waiting room's WebSocket who can send
// messages after the join; every message it receives is kept with the
// time it came.
type choiceWS struct {
	t    *testing.T
	c    *websocket.Conn
	mu   sync.Mutex
	msgs []map[string]any
	at   []time.Time
	raw  []string
	wake chan struct{}
}

func dialChoice(t *testing.T, s *stack, saleID, user int64) *choiceWS {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		cancel()
		t.Fatalf("dial: %v", err)
	}
	w := &choiceWS{t: t, c: c, wake: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			var m map[string]any
			_ = json.Unmarshal(data, &m)
			w.mu.Lock()
			w.msgs, w.at, w.raw = append(w.msgs, m), append(w.at, time.Now()), append(w.raw, string(data))
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
	w.send(map[string]any{"type": "join", "accessToken": s.Token(user, false)})
	w.next("the first status", 0, isType("status"))
	return w
}

func (w *choiceWS) send(m map[string]any) {
	w.t.Helper()
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
		w.t.Fatalf("send %s: %v", b, err)
	}
}

// mark is where the next message will be kept.
func (w *choiceWS) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

// next waits for a message from index from on that pred accepts and
// returns it and when it came.
func (w *choiceWS) next(what string, from int, pred func(map[string]any) bool) (map[string]any, time.Time) {
	w.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		w.mu.Lock()
		for i := from; i < len(w.msgs); i++ {
			if pred(w.msgs[i]) {
				m, at := w.msgs[i], w.at[i]
				w.mu.Unlock()
				return m, at
			}
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-deadline:
			w.mu.Lock()
			defer w.mu.Unlock()
			w.t.Fatalf("no %s within 20s; got %v", what, w.raw[from:])
		}
	}
}

// TestQueueOrderItemChoice: a queue sale of two items, S (2 units) and M
// (2), and eight shoppers who join, while the sale is paused, in rank
// order (after the draw a place is the join order), some on the
// WebSocket and some polling (answers checked against docs/openapi.yaml),
// and choose:
//
//	rank 0 S (ws), 1 S (poll), 2 S (ws), 3 S then M (poll), 4 M (ws),
//	5 M (poll), 6 S (poll), 7 none (poll).
//
// At the resume the holds go to ranks 0 and 1 (S) and 3 and 4 (M: the
// changed choice counts); rank 2, whose S sold out before its turn, keeps
// its place and is told so on its WebSocket in the tick that passed it.
// Choices after a hold are refused CHOICE_CLOSED, of an item not in the
// sale INVALID. Rank 2 switches to M: the unit the operator adds goes to
// it, not to rank 5 behind it. Rank 1 lets its S hold lapse: the unit goes
// to rank 6, the next who wants S, past rank 5 who wants M.
func TestQueueOrderItemChoice(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	s := startStack(t)
	op := s.Token(1, true)
	created := s.Do("POST", "/api/admin/sales", op, map[string]any{
		"name": "choice", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": 1, "allocation": "queue", "claimWindowSeconds": 10,
		"items": []map[string]any{
			{"productId": 601, "quantity": 2, "priceCents": 1999, "name": "S"},
			{"productId": 602, "quantity": 2, "priceCents": 1999, "name": "M"},
		},
	})
	s.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	var itemS, itemM int64
	for i, it := range created.Body["items"].([]any) {
		id := int64(it.(map[string]any)["id"].(float64))
		if i == 0 {
			itemS = id
		} else {
			itemM = id
		}
	}
	s.waitSale(saleID)
	s.Want(s.control(saleID, "pause", nil), 200, "")
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	user := func(rank int) int64 { return int64(700 + rank) }
	// Every polling answer is checked against docs/openapi.yaml.
	spec := newSpecCheck(t, s.Stack)
	poll := func(rank int, query string) apptest.Resp {
		t.Helper()
		return spec.call(false, "GET", queue+query, s.Token(user(rank), false), nil)
	}
	choose := func(rank int, item int64) apptest.Resp {
		t.Helper()
		return poll(rank, fmt.Sprintf("?itemId=%d", item))
	}
	num := func(m map[string]any, k string) int64 { f, _ := m[k].(float64); return int64(f) }
	// A shopper who keeps the place: WAITING, or SOLD_OUT while every
	// unit is held (back to WAITING when one is free).
	waiting := func(m map[string]any) bool { return m["state"] == "WAITING" || m["state"] == "SOLD_OUT" }

	ws := map[int]*choiceWS{}
	for rank := range 8 {
		if rank == 0 || rank == 2 || rank == 4 {
			ws[rank] = dialChoice(t, s, saleID, user(rank))
			continue
		}
		s.Want(s.Do("POST", queue, s.Token(user(rank), false), nil), 200, "")
	}
	// Each rank is its join order: nobody joined before the draw.
	for rank := range 8 {
		if ws[rank] != nil {
			continue
		}
		st := poll(rank, "")
		s.Want(st, 200, "")
		if st.Body["state"] != "PAUSED" {
			t.Fatalf("rank %d before the resume: %s", rank, st.Raw)
		}
	}

	wsChoose := func(rank int, item int64, want func(map[string]any) bool) map[string]any {
		t.Helper()
		from := ws[rank].mark()
		ws[rank].send(map[string]any{"type": "choose", "itemId": item})
		m, _ := ws[rank].next(fmt.Sprintf("rank %d's answer to choosing %d", rank, item), from, func(m map[string]any) bool {
			return m["type"] == "status" || m["type"] == "choiceRefused"
		})
		if !want(m) {
			t.Fatalf("rank %d chose %d: %v", rank, item, m)
		}
		return m
	}
	chosen := func(item int64) func(map[string]any) bool {
		return func(m map[string]any) bool { return m["type"] == "status" && num(m, "chosenItemId") == item }
	}
	refused := func(code string) func(map[string]any) bool {
		return func(m map[string]any) bool { return m["type"] == "choiceRefused" && m["error"] == code }
	}
	wsChoose(0, itemS, chosen(itemS))
	s.Want(choose(1, itemS), 200, "")
	wsChoose(2, itemS, chosen(itemS))
	s.Want(choose(3, itemS), 200, "")
	if r := choose(3, itemM); r.Status != 200 || num(r.Body, "chosenItemId") != itemM {
		t.Fatalf("rank 3 changes to M: %s", r.Raw)
	}
	wsChoose(4, itemM, chosen(itemM))
	s.Want(choose(5, itemM), 200, "")
	s.Want(choose(6, itemS), 200, "")
	// Not an item of the sale: refused, nothing changed.
	wsChoose(4, 999999, refused("INVALID"))
	s.Want(choose(5, 999999), 400, "INVALID")
	if r := poll(5, ""); num(r.Body, "chosenItemId") != itemM {
		t.Fatalf("rank 5 after a refused choice: %s", r.Raw)
	}
	s.Want(choose(99, itemS), 404, "NOT_FOUND") // never joined

	from2 := ws[2].mark()
	from0 := ws[0].mark()
	s.Want(s.control(saleID, "resume", nil), 200, "")

	// Ranks 0, 1 hold S; 3, 4 hold M; rank 2 is passed over and told at
	// once, in the tick that admitted rank 0.
	adm0, at0 := ws[0].next("rank 0's admission", from0, isType("admitted"))
	if num(adm0, "heldItemId") != itemS {
		t.Fatalf("rank 0 admitted: %v; want S (%d) held", adm0, itemS)
	}
	told, at2 := ws[2].next("rank 2 told S sold out", from2, func(m map[string]any) bool {
		return m["type"] == "status" && m["chosenSoldOut"] == true
	})
	if !waiting(told) || num(told, "chosenItemId") != itemS {
		t.Fatalf("rank 2 passed over: %v; want waiting with S chosen and sold out", told)
	}
	// Passed over, rank 2 is next for S.
	ws[2].next("rank 2 at position 0", from2, func(m map[string]any) bool {
		return m["type"] == "status" && waiting(m) && m["chosenSoldOut"] == true && num(m, "position") == 0
	})
	if d := at2.Sub(at0); d > 400*time.Millisecond || d < -400*time.Millisecond {
		t.Fatalf("rank 2 told %v from rank 0's admission; want the same tick", d)
	}
	adm4, _ := ws[4].next("rank 4's admission", 0, isType("admitted"))
	if num(adm4, "heldItemId") != itemM {
		t.Fatalf("rank 4 admitted: %v; want M (%d)", adm4, itemM)
	}
	tokens := map[int]string{0: adm0["admissionToken"].(string), 4: adm4["admissionToken"].(string)}
	for _, c := range []struct {
		rank int
		item int64
	}{{1, itemS}, {3, itemM}} {
		r := poll(c.rank, "")
		s.Want(r, 200, "")
		if num(r.Body, "heldItemId") != c.item || r.Body["admissionToken"] == nil {
			t.Fatalf("rank %d: %s; want %d held", c.rank, r.Raw, c.item)
		}
		tokens[c.rank] = r.Body["admissionToken"].(string)
	}
	for _, rank := range []int{5, 6, 7} {
		r := poll(rank, "")
		if r.Body["admissionToken"] != nil || !waiting(r.Body) {
			t.Fatalf("rank %d with every unit held: %s", rank, r.Raw)
		}
	}

	// After the hold the choice is fixed.
	wsChoose(0, itemM, refused("CHOICE_CLOSED"))
	s.Want(choose(3, itemS), 409, "CHOICE_CLOSED")

	// Ranks 0, 3 and 4 buy; rank 1 does not.
	for rank, item := range map[int]int64{0: itemS, 3: itemM, 4: itemM} {
		s.Want(s.purchase(user(rank), item, tokens[rank]), 202, "")
	}

	// Rank 2 switches to M, sold out too: it keeps its place. The unit
	// the operator adds goes to it, not to rank 5.
	sw := wsChoose(2, itemM, chosen(itemM))
	if sw["chosenSoldOut"] != true || !waiting(sw) {
		t.Fatalf("rank 2 switched to M: %v; want M shown sold out", sw)
	}
	from2 = ws[2].mark()
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/items/%d/stock", saleID, itemM), op, map[string]any{"add": 1}), 200, "")
	adm2, _ := ws[2].next("rank 2's admission", from2, isType("admitted"))
	if num(adm2, "heldItemId") != itemM {
		t.Fatalf("rank 2 admitted: %v; want M", adm2)
	}
	if r := poll(5, ""); r.Body["admissionToken"] != nil {
		t.Fatalf("rank 5 took the added unit before rank 2: %s", r.Raw)
	}
	s.Want(s.purchase(user(2), itemM, adm2["admissionToken"].(string)), 202, "")

	// Rank 1's window ends unused: its S unit goes to rank 6, past rank
	// 5 who wants M (passed over, told at its next poll).
	var r6 apptest.Resp
	waitFor(t, "the lapsed S held for rank 6", func() bool {
		r6 = poll(6, "")
		return r6.Body["admissionToken"] != nil
	})
	if num(r6.Body, "heldItemId") != itemS {
		t.Fatalf("rank 6: %s; want S held", r6.Raw)
	}
	r5 := poll(5, "")
	if r5.Body["admissionToken"] != nil || !waiting(r5.Body) || r5.Body["chosenSoldOut"] != true || num(r5.Body, "chosenItemId") != itemM {
		t.Fatalf("rank 5 after the lapse: %s; want waiting, M chosen and sold out", r5.Raw)
	}
	if r7 := poll(7, ""); r7.Body["admissionToken"] != nil {
		t.Fatalf("rank 7 admitted: %s", r7.Raw)
	}
}

// TestRaceSaleHasNoChoice: in a sale allocated in a race a choose is
// INVALID: over the WebSocket, as any message after the join, it closes
// the connection; the polling call answers 400.
func TestRaceSaleHasNoChoice(t *testing.T) {
	s := startStack(t)
	created := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "race", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": 1, "allocation": "race",
		"items": []map[string]any{{"productId": 603, "quantity": 1, "priceCents": 1999}, {"productId": 604, "quantity": 1, "priceCents": 1999}},
	})
	s.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	item := int64(created.Body["items"].([]any)[1].(map[string]any)["id"].(float64))
	s.waitSale(saleID)
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	s.Want(s.Do("POST", queue, s.Token(801, false), nil), 200, "")
	s.Want(s.Do("GET", fmt.Sprintf("%s?itemId=%d", queue, item), s.Token(801, false), nil), 400, "INVALID")
	s.Want(s.Do("GET", queue, s.Token(801, false), nil), 200, "")

	w := dialChoice(t, s, saleID, 802)
	from := w.mark()
	w.send(map[string]any{"type": "choose", "itemId": item})
	if m, _ := w.next("the error", from, isType("error")); m["error"] != "INVALID" {
		t.Fatalf("choose in a race sale: %v", m)
	}
}

// TestQueueOrderItemChoiceTwoGateways: the choice across two gateways and
// a lease that moves. A shopper on gateway B's WebSocket is passed over
// for S (the unit goes to rank 0, on gateway A), switches to M there, and
// gets the M unit that rank 2 lets lapse, though the lease was taken from
// whichever gateway led, so that the leader of the lapse is chosen anew.
func TestQueueOrderItemChoiceTwoGateways(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	a, b := twoGateways(t)
	op := a.Token(1, true)
	created := a.Do("POST", "/api/admin/sales", op, map[string]any{
		"name": "choice", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": 1, "allocation": "queue", "claimWindowSeconds": 10,
		"items": []map[string]any{
			{"productId": 611, "quantity": 1, "priceCents": 1999, "name": "S"},
			{"productId": 612, "quantity": 1, "priceCents": 1999, "name": "M"},
		},
	})
	a.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	its := created.Body["items"].([]any)
	itemS, itemM := int64(its[0].(map[string]any)["id"].(float64)), int64(its[1].(map[string]any)["id"].(float64))
	a.waitSale(saleID)
	b.waitSale(saleID)
	a.Want(a.control(saleID, "pause", nil), 200, "")
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	num := func(m map[string]any, k string) int64 { f, _ := m[k].(float64); return int64(f) }

	// Rank 0 on A (polling), rank 1 on B (WebSocket), rank 2 on B (polling).
	a.Want(a.Do("POST", queue, a.Token(900, false), nil), 200, "")
	a.Want(a.Do("GET", fmt.Sprintf("%s?itemId=%d", queue, itemS), a.Token(900, false), nil), 200, "")
	w := dialChoice(t, b, saleID, 901)
	from := w.mark()
	w.send(map[string]any{"type": "choose", "itemId": itemS})
	w.next("rank 1's choice of S", from, func(m map[string]any) bool { return m["type"] == "status" && num(m, "chosenItemId") == itemS })
	b.Want(b.Do("POST", queue, b.Token(902, false), nil), 200, "")
	b.Want(b.Do("GET", fmt.Sprintf("%s?itemId=%d", queue, itemM), b.Token(902, false), nil), 200, "")

	from = w.mark()
	a.Want(a.control(saleID, "resume", nil), 200, "")
	w.next("rank 1 told S is sold out", from, func(m map[string]any) bool { return m["type"] == "status" && m["chosenSoldOut"] == true })
	var tok0 string
	waitFor(t, "rank 0 holding S", func() bool {
		r := a.Do("GET", queue, a.Token(900, false), nil)
		tok0, _ = r.Body["admissionToken"].(string)
		return tok0 != "" && num(r.Body, "heldItemId") == itemS
	})
	a.Want(a.purchase(900, itemS, tok0), 202, "")

	// Rank 1 switches to M (held by rank 2): it keeps its place, and is
	// told M is sold out for now. The first status after the switch may
	// carry B's stock as read before rank 2's hold (B reads it each tick;
	// on a loaded machine a tick comes late): the one that says so follows.
	from = w.mark()
	w.send(map[string]any{"type": "choose", "itemId": itemM})
	w.next("rank 1's switch, M sold out for now", from, func(m map[string]any) bool {
		return m["type"] == "status" && num(m, "chosenItemId") == itemM && m["chosenSoldOut"] == true
	})
	// The lease goes to nobody for a moment: the next leader, either
	// gateway, serves the lapse.
	rdb, err := redisconn.New(redisconn.Config{URL: a.Config.RedisURL, Cluster: a.Config.RedisCluster})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	// The lease key of the documented layout (waitroom/store.go): the
	// layout keeps package lua out of these tests.
	lease := fmt.Sprintf("wr:{s%d}:lease", saleID)
	if leader, err := rdb.Get(context.Background(), lease).Result(); err != nil || leader == "" {
		t.Fatalf("the sale's lease %s: %q, %v; want a leader's id", lease, leader, err)
	}
	if err := rdb.Set(context.Background(), lease, "nobody", 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	// Rank 2's window ends unused: M goes to rank 1, on B.
	adm, _ := w.next("rank 1's admission", from, isType("admitted"))
	if num(adm, "heldItemId") != itemM {
		t.Fatalf("rank 1 admitted: %v; want M held", adm)
	}
	b.Want(b.purchase(901, itemM, adm["admissionToken"].(string)), 202, "")
}
