package wiring_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// reportDoc is the part of GET /api/admin/sales/{id}/report this test reads.
type reportDoc struct {
	SaleID int64                 `json:"saleId"`
	State  string                `json:"state"`
	Final  bool                  `json:"final"`
	Room   flashsale.RoomReport  `json:"room"`
	Orders flashsale.OrderReport `json:"orders"`
}

// TestReportAfterTheDrop runs a sale through the whole stack (shoppers on
// WebSockets, a blocked one refused by the room and by the gateway,
// purchases, a payment and a cancel) and reads its report: the figures are exactly what happened,
// the waits are ordered and within what the shoppers measured, the CSV
// says the same per minute, and the report is final once the sale ends.
func TestReportAfterTheDrop(t *testing.T) {
	t.Parallel() // waits for the gateways' roll-up (every 5 s)
	began := time.Now()
	s := startStack(t)
	c := newSpecCheck(t, s.Stack)
	op := s.Token(1, true)
	// User 999 is on the blocklist: the room refuses the join.
	blocked := strings.Replace(apptest.Permissive, `"users": []`, `"users": ["999"]`, 1)
	if err := s.App.SetDefense(context.Background(), "test", []byte(blocked)); err != nil {
		t.Fatal(err)
	}
	saleID, items := s.createSale(3, 3)
	itemA, itemB := items[0], items[1]
	path := fmt.Sprintf("/api/admin/sales/%d/report", saleID)

	// Six shoppers join on WebSockets and are admitted.
	start := time.Now()
	users := []int64{101, 102, 103, 104, 105, 106}
	shoppers := make([]*wsShopper, len(users))
	for i, u := range users {
		shoppers[i] = joinWS(t, s, saleID, u)
	}
	tokens := make([]string, len(users))
	for i, w := range shoppers {
		i0 := w.waitFor("admission", isType("admitted"))
		w.mu.Lock()
		tokens[i], _ = w.msgs[i0]["admissionToken"].(string)
		w.mu.Unlock()
	}
	// Every server-side wait lies inside this interval. The fleet clock
	// the room reads may be corrected between two readings, by far less
	// than the slack.
	longest := time.Since(start).Milliseconds() + 500
	refused := joinWS(t, s, saleID, 999)
	refused.waitFor("BLOCKED", func(m map[string]any) bool { return m["type"] == "error" && m["error"] == "BLOCKED" })
	// By polling the gateway's user check refuses it before the room.
	s.Want(s.Do("POST", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), s.Token(999, false), nil), 403, "BLOCKED")

	// Three buy A, two buy B, the sixth buys nothing; the first pays, the
	// third cancels.
	orderOf := map[int64]string{}
	for i, u := range users[:5] {
		item := itemA
		if i >= 3 {
			item = itemB
		}
		r := s.purchase(u, item, tokens[i])
		s.Want(r, 202, "")
		orderOf[u] = r.Body["orderId"].(string)
	}
	for _, u := range users[:5] {
		s.waitPayable(u, orderOf[u])
	}
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+orderOf[101]+"/pay", s.Token(101, false), map[string]string{"paymentToken": "tok"}), 200, "")
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+orderOf[103]+"/cancel", s.Token(103, false), nil), 200, "")

	// The room's figures reach PostgreSQL with the gateway's next write.
	var rep reportDoc
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the report to count every join and wait (last %+v)", rep.Room) }, 20*time.Second, func() bool {
		r := c.call(false, "GET", path, op, nil)
		s.Want(r, 200, "")
		rep = reportDoc{}
		if err := json.Unmarshal(r.Raw, &rep); err != nil {
			t.Fatalf("report %s: %v", r.Raw, err)
		}
		return rep.Room.Joined == 6 && rep.Room.Admitted == 6 && rep.Room.Wait.Count == 6 && rep.Room.Refusals["blocklist"] == 2
	})
	room, ord := rep.Room, rep.Orders
	if room.Waiting != 0 || room.Holds != 0 || len(room.Refusals) != 1 {
		t.Errorf("room = %+v, want 0 waiting, 0 holds and only the blocklist's refusal", room)
	}
	if room.PreQueue > room.Joined {
		t.Errorf("preQueue = %d > joined %d", room.PreQueue, room.Joined)
	}
	w := room.Wait
	if !(0 <= w.MinMs && w.MinMs <= w.P50Ms && w.P50Ms <= w.P90Ms && w.P90Ms <= w.P99Ms && w.P99Ms <= w.MaxMs && w.MaxMs <= longest) {
		t.Errorf("wait = %+v, want 0 ≤ min ≤ p50 ≤ p90 ≤ p99 ≤ max ≤ %d ms (measured)", w, longest)
	}
	var joins, admissions int64
	for i, m := range room.Minutes {
		joins += m.Joins
		admissions += m.Admissions
		if i > 0 && !m.At.Equal(room.Minutes[i-1].At.Add(time.Minute)) {
			t.Errorf("minute %d at %v follows %v", i, m.At, room.Minutes[i-1].At)
		}
	}
	if joins != 6 || admissions != 6 {
		t.Errorf("minutes add up to %d joins and %d admissions, want 6 and 6", joins, admissions)
	}
	wantStatus := map[flashsale.OrderStatus]int64{flashsale.OrderPending: 3, flashsale.OrderPaid: 1, flashsale.OrderCancelled: 1}
	if fmt.Sprint(ord.ByStatus) != fmt.Sprint(wantStatus) {
		t.Errorf("orders by status = %v, want %v", ord.ByStatus, wantStatus)
	}
	// Each item's last sale is a placement of this test's, and the
	// sell-out curve at its finest step adds up to the units sold, per
	// item, each point on its step.
	for i := range ord.Items {
		it := &ord.Items[i]
		if it.LastSoldAt == nil || it.LastSoldAt.Before(began) || it.LastSoldAt.After(time.Now()) {
			t.Errorf("item %d lastSoldAt = %v, want a time since %v", it.ItemID, it.LastSoldAt, began)
		}
		it.LastSoldAt = nil
	}
	curve := map[int64]int64{}
	for i, p := range ord.SellOut.Points {
		if p.At.UnixMilli()%ord.SellOut.StepMs != 0 || (i > 0 && !p.At.After(ord.SellOut.Points[i-1].At)) {
			t.Errorf("sell-out point %d at %v: not on a %d ms step after the one before", i, p.At, ord.SellOut.StepMs)
		}
		for _, it := range p.Items {
			curve[it.ItemID] += it.Sold
		}
	}
	if ord.SellOut.StepMs != 100 || curve[itemA] != 2 || curve[itemB] != 2 || len(curve) != 2 {
		t.Errorf("sell-out curve: step %d ms, sold %v; want 100 ms and 2 units of each item", ord.SellOut.StepMs, curve)
	}
	wantItems := []flashsale.ItemSold{{ItemID: itemA, Sold: 2, Paid: 1}, {ItemID: itemB, Sold: 2}}
	if fmt.Sprint(ord.Items) != fmt.Sprint(wantItems) || ord.Sold != 4 || ord.Placed != 5 || ord.Paid != 1 || ord.Conversion != 0.2 {
		t.Errorf("orders = %+v, want items %v, 4 sold, 5 placed, 1 paid, conversion 0.2", ord, wantItems)
	}
	var sold, paid int64
	for _, m := range ord.Minutes {
		sold += m.Sold
		paid += m.Paid
	}
	if sold != 4 || paid != 1 {
		t.Errorf("order minutes add up to %d sold and %d paid, want 4 and 1", sold, paid)
	}

	// The CSV: one row per minute, the same figures.
	r := s.Do("GET", path+"?format=csv", op, nil)
	s.Want(r, 200, "")
	rows, err := csv.NewReader(strings.NewReader(string(r.Raw))).ReadAll()
	if err != nil || len(rows) < 2 {
		t.Fatalf("csv %q: %v", r.Raw, err)
	}
	wantHeader := "minute,joins,joined,pre_queue,admissions,admitted,holds,waiting,refusals,shadowed,wait_count,wait_p50_ms,wait_p90_ms,wait_p99_ms,sold,paid," +
		fmt.Sprintf("sold_item_%d,sold_item_%d", itemA, itemB)
	if got := strings.Join(rows[0], ","); got != wantHeader {
		t.Fatalf("csv header = %s, want %s", got, wantHeader)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	sums := map[string]int64{}
	for _, row := range rows[1:] {
		if _, err := time.Parse(time.RFC3339, row[0]); err != nil {
			t.Errorf("csv minute %q: %v", row[0], err)
		}
		for _, name := range []string{"joins", "admissions", "refusals", "wait_count", "sold", "paid", fmt.Sprintf("sold_item_%d", itemA)} {
			v, err := strconv.ParseInt(row[col[name]], 10, 64)
			if err != nil {
				t.Fatalf("csv %s %q: %v", name, row[col[name]], err)
			}
			sums[name] += v
		}
	}
	wantSums := map[string]int64{"joins": 6, "admissions": 6, "refusals": 2, "wait_count": 6, "sold": 4, "paid": 1, fmt.Sprintf("sold_item_%d", itemA): 2}
	if fmt.Sprint(sums) != fmt.Sprint(wantSums) {
		t.Errorf("csv columns add up to %v, want %v", sums, wantSums)
	}
	if last := rows[len(rows)-1]; last[col["joined"]] != "6" || last[col["admitted"]] != "6" {
		t.Errorf("csv last row %v: joined and admitted want 6", last)
	}

	// Bad input.
	c.s.Want(c.call(false, "GET", "/api/admin/sales/987654/report", op, nil), 404, "NOT_FOUND")
	c.s.Want(c.call(false, "GET", path, s.Token(7, false), nil), 403, "FORBIDDEN")
	s.Want(s.Do("GET", "/api/admin/sales/x/report", op, nil), 400, "INVALID")
	s.Want(s.Do("GET", path+"?format=pdf", op, nil), 400, "INVALID")

	// Live until the sale ends, final after.
	if rep.Final {
		t.Errorf("report of a running sale is final (state %s)", rep.State)
	}
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/end", saleID), op, nil), 200, "")
	end := c.call(false, "GET", path, op, nil)
	s.Want(end, 200, "")
	var after reportDoc
	if err := json.Unmarshal(end.Raw, &after); err != nil {
		t.Fatal(err)
	}
	if !after.Final || after.State != string(flashsale.SaleEnded) || after.Room.Joined != 6 {
		t.Errorf("report after the end: final %v, state %s, joined %d; want final, ENDED, 6",
			after.Final, after.State, after.Room.Joined)
	}
}

// TestReportCountsHolds: in a sale allocated in queue order with two
// units, three shoppers join; the leader holds a unit for the first two
// at their turn. The report counts two held turns, two admitted, one
// still waiting, and the two waits.
func TestReportCountsHolds(t *testing.T) {
	t.Parallel() // waits for the gateways' roll-up (every 5 s)
	s := startStack(t)
	op := s.Token(1, true)
	r := s.Do("POST", "/api/admin/sales", op, map[string]any{
		"name": "held", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"admissionRatePerSecond": 10000, "allocation": "queue",
		"items": []map[string]any{{"productId": 501, "quantity": 2, "priceCents": 1999}},
	})
	s.Want(r, 201, "")
	saleID := int64(r.Body["id"].(float64))
	for u := int64(201); u <= 203; u++ {
		joinWS(t, s, saleID, u)
	}
	var rep reportDoc
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("two held turns in the report (last %+v)", rep.Room) }, 20*time.Second, func() bool {
		r := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d/report", saleID), op, nil)
		s.Want(r, 200, "")
		rep = reportDoc{}
		if err := json.Unmarshal(r.Raw, &rep); err != nil {
			t.Fatalf("report %s: %v", r.Raw, err)
		}
		return rep.Room.Joined == 3 && rep.Room.Holds == 2 && rep.Room.Wait.Count == 2
	})
	if rep.Room.Admitted != 2 || rep.Room.Waiting != 1 || len(rep.Room.Refusals) != 0 {
		t.Errorf("room = %+v, want 2 admitted, 1 waiting, no refusal", rep.Room)
	}
	var holds int64
	for _, m := range rep.Room.Minutes {
		holds += m.Holds
	}
	if holds != 2 {
		t.Errorf("minutes add up to %d holds, want 2", holds)
	}
}
