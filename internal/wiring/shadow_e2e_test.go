package wiring_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// TestShadowQueueEndToEnd: the operator turns the shadow queue on through
// PUT /api/admin/settings (a blocklisted user, and tokens whose risk claim
// is above 0.5). The blocklisted shopper and a risky one wait on pages
// like anyone's while a clean shopper is admitted and buys; neither is
// ever admitted, and a purchase of theirs is refused NOT_ADMITTED. The
// console's shadow list names both and why; the report counts them by
// rule; a released shopper's page is closed with 1001, joins again and is
// admitted. Every answer is checked against openapi.yaml.
func TestShadowQueueEndToEnd(t *testing.T) {
	t.Parallel() // waits for the gateways' roll-up (every 5 s)
	s := startStack(t)
	c := newSpecCheck(t, s.Stack)
	op := s.Token(1, true)
	var settings map[string]any
	if err := json.Unmarshal([]byte(strings.Replace(apptest.Permissive, `"users": []`, `"users": ["901"]`, 1)), &settings); err != nil {
		t.Fatal(err)
	}
	settings["shadowQueue"] = map[string]any{"rules": map[string]bool{"blocklist": true}, "riskAbove": 0.5}
	s.Want(c.call(false, "PUT", "/api/admin/settings", op, settings), 200, "")
	saleID, items := s.createSale(5)

	risky := s.RiskToken(902, 0.9)
	clean := joinWS(t, s, saleID, 903)
	blocked := joinWS(t, s, saleID, 901)
	shadow := joinWSToken(t, s, saleID, risky)
	i := clean.waitFor("admission", isType("admitted"))
	clean.mu.Lock()
	tok, _ := clean.msgs[i]["admissionToken"].(string)
	clean.mu.Unlock()
	s.Want(s.purchase(903, items[0], tok), 202, "")
	for _, w := range []*wsShopper{blocked, shadow} {
		w.waitFor("a waiting status", isState("WAITING"))
	}
	// The blocklisted shopper's reads pass: nothing tells them.
	s.Want(s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), s.Token(901, false), nil), 200, "")
	s.Want(s.purchase(901, items[0], ""), 403, "NOT_ADMITTED")

	var q struct {
		Shadowed int64            `json:"shadowed"`
		ByRule   map[string]int64 `json:"byRule"`
		Shoppers []struct {
			UserID int64  `json:"userId"`
			Rule   string `json:"rule"`
		} `json:"shoppers"`
	}
	r := c.call(false, "GET", fmt.Sprintf("/api/admin/sales/%d/shadow", saleID), op, nil)
	s.Want(r, 200, "")
	if err := json.Unmarshal(r.Raw, &q); err != nil {
		t.Fatal(err)
	}
	if q.Shadowed != 2 || q.ByRule["blocklist"] != 1 || q.ByRule["risk"] != 1 || len(q.Shoppers) != 2 {
		t.Fatalf("shadow list %s: want 901 by blocklist and 902 by risk", r.Raw)
	}
	s.Want(c.call(false, "GET", fmt.Sprintf("/api/admin/sales/%d/shadow", saleID), s.Token(5, false), nil), 403, "FORBIDDEN")
	s.Want(s.Do("GET", fmt.Sprintf("/api/admin/sales/%d/shadow?limit=x", saleID), op, nil), 400, "INVALID") // outside the spec: not checked against it

	var rep reportDoc
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the report to count the shadowed (last %+v)", rep.Room) }, 20*time.Second, func() bool {
		r := c.call(false, "GET", fmt.Sprintf("/api/admin/sales/%d/report", saleID), op, nil)
		s.Want(r, 200, "")
		rep = reportDoc{}
		if err := json.Unmarshal(r.Raw, &rep); err != nil {
			t.Fatalf("report %s: %v", r.Raw, err)
		}
		return rep.Room.Shadowed["blocklist"] == 1 && rep.Room.Shadowed["risk"] == 1
	})
	if rep.Room.Joined != 1 {
		t.Errorf("report joined %d, want the one clean shopper (the shadowed are not in it)", rep.Room.Joined)
	}

	release := fmt.Sprintf("/api/admin/sales/%d/shadow/902/release", saleID)
	s.Want(c.call(false, "POST", release, op, nil), 200, "")
	s.Want(c.call(false, "POST", release, op, nil), 404, "NOT_FOUND")
	shadow.waitFor("the page closed going away", func(m map[string]any) bool {
		return m["type"] == "closed" && m["status"] == float64(websocket.StatusGoingAway)
	})
	back := joinWSToken(t, s, saleID, risky)
	back.waitFor("admission", isType("admitted"))
	for _, w := range []*wsShopper{blocked, shadow} {
		if n := w.count(func(m map[string]any) bool { return m["type"] == "admitted" || m["state"] == "ADMITTED" }); n != 0 {
			t.Errorf("a shadowed shopper got %d admissions", n)
		}
	}
}
