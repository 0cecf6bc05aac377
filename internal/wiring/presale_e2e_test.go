package wiring_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/waitroom"
)

// TestPresaleEndToEnd: a presale of 10 units in queue order. Tier-1
// invitation codes for the first hour, the open sale after
// (access.publicFrom). Six members join the pre-queue with their codes; a
// reused code and a shopper without one are refused and queue nothing.
// At the close the draw holds a unit for each member, in the order the
// public draw record gives, which the test recomputes from the record and
// each member's secret; nobody buys before the opening. An hour later the
// public joins behind the members: the four units left go to the first
// four, the last two are told SOLD_OUT. Exactly 10 units sold, one per
// shopper, every answer checked against openapi.yaml.
func TestPresaleEndToEnd(t *testing.T) {
	var clock jumpClock
	s := apptest.Start(t, func(c *wiring.Config) { c.DrawLead = 6 * time.Second; c.Clock = clock.Now })
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	opens := clock.Now().Add(20 * time.Second).Truncate(time.Second).UTC()
	public := opens.Add(time.Hour)
	created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
		"name": "presale", "startsAt": opens.Format(time.RFC3339), "admissionRatePerSecond": 100, "allocation": "queue",
		"access": map[string]any{"rule": "codes", "publicFrom": public.Format(time.RFC3339), "tiers": []map[string]any{{"tier": 1}}},
		"items":  []map[string]any{{"productId": 501, "quantity": 10, "priceCents": 1999}},
	})
	s.Want(created, 201, "")
	sale := int64(created.Body["id"].(float64))
	item := int64(created.Body["items"].([]any)[0].(map[string]any)["id"].(float64))
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)
	purchase := fmt.Sprintf("/api/flash-sales/items/%d/purchase", item)

	gen := c.call(false, "POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), op, map[string]any{"count": 6, "tier": 1})
	s.Want(gen, 201, "")
	var codes []string
	for _, x := range gen.Body["codes"].([]any) {
		codes = append(codes, x.(map[string]any)["code"].(string))
	}
	members := []int64{601, 602, 603, 604, 605, 606}
	for i, u := range members {
		s.Want(c.call(false, "POST", queue, s.Token(u, false), map[string]any{"code": codes[i]}), 200, "")
	}
	s.Want(c.call(false, "POST", queue, s.Token(607, false), map[string]any{"code": codes[0]}), 403, "CODE_USED")
	r := c.call(false, "POST", queue, s.Token(700, false), nil)
	s.Want(r, 403, "NOT_INVITED")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, public.Format(time.RFC3339)) {
		t.Errorf("NOT_INVITED message %q, want the public start", msg)
	}
	for _, u := range []int64{607, 700} {
		s.Want(s.Do("GET", queue, s.Token(u, false), nil), 404, "NOT_FOUND")
	}

	// The close: the draw holds a unit for every member (10 units, 6
	// places), before the opening.
	clock.AdvanceTo(opens.Add(-6 * time.Second))
	tokens, secrets := map[int64]string{}, map[int64]string{}
	for _, u := range members {
		st := testenv.EventuallyValue(t, fmt.Sprintf("member %d's hold", u), 20*time.Second, func() (map[string]any, bool) {
			a := c.call(false, "GET", queue, s.Token(u, false), nil)
			s.Want(a, 200, "")
			return a.Body, a.Body["admissionToken"] != nil
		})
		tokens[u], secrets[u] = st["admissionToken"].(string), st["drawSecret"].(string)
		if held, _ := st["heldItemId"].(float64); int64(held) != item {
			t.Fatalf("member %d: %v, want a unit of item %d held", u, st, item)
		}
	}
	// Nobody buys before the opening.
	s.Want(c.call(false, "POST", purchase, s.Token(601, false), nil, "X-Admission-Token", tokens[601]), 403, "NOT_ADMITTED")

	// The draw is verifiable from the public record: its seed matches the
	// commitment published at creation, every member finds their ticket
	// with their secret, and the record holds the members only.
	rec := testenv.EventuallyValue(t, "the draw record", 20*time.Second, func() (apptest.Resp, bool) {
		d := c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/draw", sale), "", nil)
		return d, d.Status == 200
	})
	record, err := waitroom.ParseDrawRecord(bytes.NewReader(rec.Raw), 1<<20)
	if err != nil {
		t.Fatalf("draw record %s: %v", rec.Raw, err)
	}
	if record.Commitment != created.Body["shuffleCommitment"] {
		t.Fatalf("draw record commitment %s, want the one published at creation %v", record.Commitment, created.Body["shuffleCommitment"])
	}
	check, err := waitroom.CheckDrawRecord(record)
	if err != nil || record.PreQueueSize != int64(len(members)) {
		t.Fatalf("draw record: %+v %v, want the %d members drawn", check, err, len(members))
	}
	for _, u := range members {
		sec, err := waitroom.ParseMemberSecret(secrets[u])
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := record.FindMember(u, sec); !ok {
			t.Errorf("member %d is not in the draw record", u)
		}
	}

	// The opening: every member buys their held unit and pays.
	clock.AdvanceTo(opens)
	for _, u := range members {
		b := c.call(false, "POST", purchase, s.Token(u, false), nil, "X-Admission-Token", tokens[u])
		s.Want(b, 202, "")
		order := b.Body["orderId"].(string)
		(&stack{s}).waitPayable(u, order)
		s.Want(c.call(false, "POST", "/api/flash-sales/orders/"+order+"/pay", s.Token(u, false), map[string]string{"paymentToken": "tok"}), 200, "")
	}
	s.Want(c.call(false, "POST", queue, s.Token(700, false), nil), 403, "NOT_INVITED")

	// The open sale an hour later: the public queues behind the members;
	// the four units left are held for the first four, in join order.
	clock.AdvanceTo(public)
	crowd := []int64{700, 701, 702, 703, 704, 705}
	for _, u := range crowd {
		s.Want(c.call(false, "POST", queue, s.Token(u, false), nil), 200, "")
	}
	for i, u := range crowd {
		st := testenv.EventuallyValue(t, fmt.Sprintf("shopper %d's turn or sell-out", u), 20*time.Second, func() (map[string]any, bool) {
			a := c.call(false, "GET", queue, s.Token(u, false), nil)
			s.Want(a, 200, "")
			return a.Body, a.Body["admissionToken"] != nil || a.Body["state"] == "SOLD_OUT"
		})
		switch {
		case i < 4 && st["admissionToken"] != nil:
			s.Want(c.call(false, "POST", purchase, s.Token(u, false), nil, "X-Admission-Token", st["admissionToken"].(string)), 202, "")
		case i >= 4 && st["state"] == "SOLD_OUT":
		default:
			t.Fatalf("public shopper %d (%d in line): %v", u, i+1, st)
		}
	}
	// The orders reach PostgreSQL through the writer.
	var it map[string]any
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("10 sold and none left (last %v)", it) }, 20*time.Second, func() bool {
		it = (&stack{s}).figures(sale)["items"].([]any)[0].(map[string]any)
		return it["sold"] == float64(10) && it["remaining"] == float64(0)
	})
	for _, u := range append(append([]int64{}, members...), crowd[:4]...) {
		s.Want(s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", sale), s.Token(u, false), nil), 200, "")
	}
	for _, u := range append([]int64{607}, crowd[4:]...) {
		s.Want(s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", sale), s.Token(u, false), nil), 404, "NOT_FOUND")
	}
}
