package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// paySecret is the payment provider's secret of these tests' stacks.
const paySecret = "shop-provider-secret-0123456789abcdef"

// payStack is a stack with payment callbacks on, the database at hand to
// check what a callback changed, and every answer checked against
// docs/openapi.yaml.
type payStack struct {
	*stack
	spec *specCheck
	pg   *pgxpool.Pool
}

func startPayStack(t *testing.T, mutate ...func(*wiring.Config)) *payStack {
	t.Helper()
	s := startStack(t, append([]func(*wiring.Config){func(c *wiring.Config) { c.PaymentSecret = paySecret }}, mutate...)...)
	pg, err := pgxpool.New(context.Background(), s.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return &payStack{stack: s, spec: newSpecCheck(t, s.Stack), pg: pg}
}

// payBody is a callback body in USD, the currency of createSale's items.
func payBody(paymentID string, amount int64) []byte {
	return payBodyIn(paymentID, amount, "USD")
}

// payBodyIn is a callback body in the currency.
func payBodyIn(paymentID string, amount int64, currency string) []byte {
	b, _ := json.Marshal(map[string]any{"paymentId": paymentID, "amountCents": amount, "currency": currency})
	return b
}

// paySig signs a callback of the order with the provider's secret.
func paySig(orderID string, t time.Time, body []byte) string {
	return events.SignFor([]byte(paySecret), t, orderID, body)
}

// callback sends a payment callback with the raw body and signature
// header (none when sig is "") and checks the answer against the file;
// valid says whether the request itself is one the file allows.
func (s *payStack) callback(orderID string, body []byte, sig string, valid bool) apptest.Resp {
	s.T.Helper()
	var hdr []string
	if sig != "" {
		hdr = []string{"X-Flashsale-Signature", sig}
	}
	return s.spec.exchange(valid, s.App.PublicURL, "POST", "/api/shop/orders/"+orderID+"/paid", "", body, hdr...)
}

// pay sends a correctly signed callback signed at t.
func (s *payStack) pay(orderID, paymentID string, amount int64, t time.Time) apptest.Resp {
	s.T.Helper()
	body := payBody(paymentID, amount)
	return s.callback(orderID, body, paySig(orderID, t, body), true)
}

// bought has user buy item and waits until the order is in PostgreSQL.
func (s *payStack) bought(user, saleID, itemID int64) string {
	s.T.Helper()
	r := s.purchase(user, itemID, s.admit(user, saleID))
	s.Want(r, 202, "")
	id := r.Body["orderId"].(string)
	testenv.Eventually(s.T, "order "+id+" stored", 15*time.Second, func() bool { return s.dbStatus(id) != "" })
	return id
}

// dbStatus is the order's status in PostgreSQL ("" when not there).
func (s *payStack) dbStatus(orderID string) string {
	s.T.Helper()
	var st string
	err := s.pg.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, orderID).Scan(&st)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		s.T.Fatal(err)
	}
	return st
}

// orderEvent is one event of the outbox.
type orderEvent struct {
	Type, Status, PaymentID, Reason string
}

// events are the order's events of the given types, oldest first.
func (s *payStack) events(orderID string, types ...string) []orderEvent {
	s.T.Helper()
	rows, err := s.pg.Query(context.Background(), `SELECT body FROM order_events WHERE order_id = $1 AND type = ANY($2) ORDER BY id`, orderID, types)
	if err != nil {
		s.T.Fatal(err)
	}
	defer rows.Close()
	var out []orderEvent
	for rows.Next() {
		var body []byte
		if err := rows.Scan(&body); err != nil {
			s.T.Fatal(err)
		}
		var ev struct {
			Type, Status, PaymentID, Reason string
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			s.T.Fatal(err)
		}
		out = append(out, orderEvent(ev))
	}
	if err := rows.Err(); err != nil {
		s.T.Fatal(err)
	}
	return out
}

// payments is the number of recorded payments of the order.
func (s *payStack) payments(orderID string) int {
	s.T.Helper()
	var n int
	if err := s.pg.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE order_id = $1`, orderID).Scan(&n); err != nil {
		s.T.Fatal(err)
	}
	return n
}

// wantPaid checks a 200 answer of a callback.
func (s *payStack) wantPaid(r apptest.Resp, orderID, paymentID string) {
	s.T.Helper()
	s.Want(r, 200, "")
	if r.Body["orderId"] != orderID || r.Body["status"] != "PAID" || r.Body["paymentId"] != paymentID {
		s.T.Fatalf("callback answer %s, want order %s PAID by %s", r.Raw, orderID, paymentID)
	}
}

// TestShopPaymentCallback: a correctly signed callback pays a PENDING
// order once, with its order.paid event; a repeat of the payment id
// answers the same and changes nothing; a replay of the exact request is
// REPLAYED; a second payment of the paid order is refused ORDER_PAID with
// a payment.refused event. Every bad request is refused with its code and
// changes and records nothing.
func TestShopPaymentCallback(t *testing.T) {
	s := startPayStack(t)
	saleID, items := s.createSale(5)
	item := items[0]
	orderID := s.bought(100, saleID, item)
	now := time.Now()

	// Bad requests: nothing changes, nothing is recorded.
	good := payBody("pi_1", 1999)
	sign := func(t time.Time, body []byte) string { return paySig(orderID, t, body) }
	mis := []byte(`{"paymentId":"pi_1","amountCents":1999,"currency":"USD","orderId":"00000000-0000-4000-8000-000000000001"}`)
	// Just over the 16 KiB body limit: the server answers 413 from the
	// head and closes; a body that fits the socket buffers is written
	// whole first, where a larger one could meet the close mid-write
	// (connection reset) and lose the answer.
	huge := []byte(`{"paymentId":"pi_1","amountCents":1999,"currency":"` + strings.Repeat("x", 17<<10) + `"}`)
	bad := []struct {
		name    string
		order   string
		body    []byte
		sig     string
		status  int
		code    string
		message string
	}{
		{"no signature", orderID, good, "", 401, "BAD_SIGNATURE", ""},
		{"malformed signature", orderID, good, "v1=abc", 401, "BAD_SIGNATURE", ""},
		{"signature of another secret", orderID, good, events.SignFor([]byte("guess"), now, orderID, good), 401, "BAD_SIGNATURE", ""},
		{"signature without the order", orderID, good, events.Sign([]byte(paySecret), now, good), 401, "BAD_SIGNATURE", ""},
		{"no currency", orderID, []byte(`{"paymentId":"pi_1","amountCents":1999}`), sign(now, []byte(`{"paymentId":"pi_1","amountCents":1999}`)), 400, "INVALID", "currency"},
		{"signature of another body", orderID, good, sign(now, payBody("pi_1", 1)), 401, "BAD_SIGNATURE", ""},
		{"signed 6 minutes ago", orderID, good, sign(now.Add(-6*time.Minute), good), 401, "STALE_SIGNATURE", ""},
		{"signed 6 minutes ahead", orderID, good, sign(now.Add(6*time.Minute), good), 401, "STALE_SIGNATURE", ""},
		{"bad JSON", orderID, []byte(`{"paymentId":`), sign(now, []byte(`{"paymentId":`)), 400, "INVALID", "malformed"},
		{"no paymentId", orderID, []byte(`{"amountCents":1999}`), sign(now, []byte(`{"amountCents":1999}`)), 400, "INVALID", "paymentId"},
		{"body of another order", orderID, mis, sign(now, mis), 400, "INVALID", "orderId"},
		{"unknown order", "00000000-0000-4000-8000-000000000001", good, paySig("00000000-0000-4000-8000-000000000001", now, good), 404, "NOT_FOUND", ""},
		{"malformed order id", "nope", good, paySig("nope", now, good), 400, "INVALID", ""},
		{"too large", orderID, huge, sign(now, huge), 413, "TOO_LARGE", ""},
	}
	for _, b := range bad {
		r := s.callback(b.order, b.body, b.sig, false)
		if r.Status != b.status || r.Body["error"] != b.code {
			t.Errorf("%s: %d %s, want %d %s", b.name, r.Status, r.Raw, b.status, b.code)
		}
		if msg, _ := r.Body["message"].(string); !strings.Contains(msg, b.message) {
			t.Errorf("%s: message %q does not say %q", b.name, msg, b.message)
		}
	}
	if st := s.dbStatus(orderID); st != "PENDING" {
		t.Fatalf("after bad callbacks the order is %s, want PENDING", st)
	}
	if n, ev := s.payments(orderID), s.events(orderID, "order.paid", "payment.refused"); n != 0 || len(ev) != 0 {
		t.Fatalf("bad callbacks recorded %d payments and events %v", n, ev)
	}

	// The shopper's order shows no payment page without FLASHSALE_PAYMENT_URL.
	o := s.spec.call(false, "GET", "/api/flash-sales/orders/"+orderID, s.Token(100, false), nil)
	if _, ok := o.Body["paymentUrl"]; ok {
		t.Fatalf("order without FLASHSALE_PAYMENT_URL has a paymentUrl: %s", o.Raw)
	}

	// The payment.
	first := sign(now, good)
	s.wantPaid(s.callback(orderID, good, first, true), orderID, "pi_1")
	if st := s.dbStatus(orderID); st != "PAID" {
		t.Fatalf("order is %s after the callback, want PAID", st)
	}
	o = s.spec.call(false, "GET", "/api/flash-sales/orders/"+orderID, s.Token(100, false), nil)
	if o.Body["status"] != "PAID" {
		t.Fatalf("shopper reads %s", o.Raw)
	}
	// The exact request again: a replay.
	s.Want(s.callback(orderID, good, first, true), 409, "REPLAYED")
	// The provider's retry (signed anew): the same answer.
	s.wantPaid(s.pay(orderID, "pi_1", 1999, now.Add(-time.Second)), orderID, "pi_1")
	if got := s.events(orderID, "order.paid", "payment.refused"); len(got) != 1 || got[0] != (orderEvent{"order.paid", "PAID", "pi_1", ""}) {
		t.Fatalf("events %+v, want one order.paid by pi_1", got)
	}

	// Another payment of the paid order: refused, with an event to refund
	// from; its retry answers the same and adds nothing.
	for i := range 2 {
		r := s.pay(orderID, "pi_2", 1999, now.Add(-time.Duration(i)*time.Second))
		s.Want(r, 409, "ORDER_PAID")
	}
	want := []orderEvent{{"order.paid", "PAID", "pi_1", ""}, {"payment.refused", "PAID", "pi_2", "DUPLICATE_PAYMENT"}}
	if got := s.events(orderID, "order.paid", "payment.refused"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	if n := s.payments(orderID); n != 2 {
		t.Fatalf("%d payments recorded, want 2", n)
	}
	// pi_1 names this order; for another order it is refused (signed
	// anew: the signature of this order's request names this order).
	other := s.bought(101, saleID, item)
	s.Want(s.callback(other, good, first, true), 401, "BAD_SIGNATURE")
	s.Want(s.pay(other, "pi_1", 1999, now.Add(-2*time.Second)), 400, "INVALID")
	if st := s.dbStatus(other); st != "PENDING" {
		t.Fatalf("the other order is %s, want PENDING", st)
	}

	// A cancelled order: refused ORDER_CANCELLED, stock untouched.
	cancelled := s.bought(102, saleID, item)
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+cancelled+"/cancel", s.Token(102, false), nil), 200, "")
	before := s.figures(saleID)
	s.Want(s.pay(cancelled, "pi_3", 1999, now), 409, "ORDER_CANCELLED")
	if got := s.events(cancelled, "order.paid", "payment.refused"); len(got) != 1 || got[0] != (orderEvent{"payment.refused", "CANCELLED", "pi_3", "ORDER_CANCELLED"}) {
		t.Fatalf("events %+v, want one payment.refused ORDER_CANCELLED", got)
	}
	after := s.figures(saleID)
	for _, f := range []string{"remaining", "sold", "paid"} {
		if b, a := itemFigure(t, before, item, f), itemFigure(t, after, item, f); a != b {
			t.Errorf("%s went from %d to %d on a refused payment", f, b, a)
		}
	}
}

// TestShopPaymentAfterExpiry: a payment after the window, whether the
// expiry worker has reached the order (EXPIRED) or not yet (PENDING past
// expires_at), is refused ORDER_EXPIRED with a payment.refused event;
// nothing is paid and the unit is not taken back from the stock. The
// stack's fleet clock is the test's, which jumps past the window.
func TestShopPaymentAfterExpiry(t *testing.T) {
	const window = 2 * time.Second
	var clock jumpClock
	// The expiry worker runs at start and then not within the test.
	s := startPayStack(t, func(c *wiring.Config) { c.PaymentWindow, c.ExpiryInterval, c.Clock = window, time.Hour, clock.Now })
	saleID, items := s.createSale(3)
	item := items[0]
	late := s.bought(100, saleID, item)
	o := s.Do("GET", "/api/flash-sales/orders/"+late, s.Token(100, false), nil)
	exp, err := time.Parse(time.RFC3339Nano, fmt.Sprint(o.Body["expiresAt"]))
	if err != nil {
		t.Fatalf("order %s: expiresAt: %v", o.Raw, err)
	}
	clock.AdvanceTo(exp.Add(100 * time.Millisecond))
	before := s.figures(saleID)
	// The retry, signed a second earlier than the first (a signature has
	// a whole-second time: both taken from one clock reading, so they
	// never fall in the same second and read as a replay), answers the
	// same.
	signedAt := time.Now()
	for i := range 2 {
		s.Want(s.pay(late, "pi_late", 1999, signedAt.Add(-time.Duration(i)*time.Second)), 409, "ORDER_EXPIRED")
	}
	if st := s.dbStatus(late); st != "PENDING" {
		t.Fatalf("a refused payment changed the order to %s", st)
	}
	if got := s.events(late, "order.paid", "payment.refused"); len(got) != 1 || got[0] != (orderEvent{"payment.refused", "PENDING", "pi_late", "ORDER_EXPIRED"}) {
		t.Fatalf("events %+v, want one payment.refused ORDER_EXPIRED", got)
	}
	after := s.figures(saleID)
	for _, f := range []string{"remaining", "sold", "paid"} {
		if b, a := itemFigure(t, before, item, f), itemFigure(t, after, item, f); a != b {
			t.Errorf("%s went from %d to %d on a refused payment", f, b, a)
		}
	}
	// Once EXPIRED (by the shopper's cancel past the window, which
	// expires it), the same.
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+late+"/cancel", s.Token(100, false), nil), 409, "ORDER_EXPIRED")
	if st := s.dbStatus(late); st != "EXPIRED" {
		t.Fatalf("order is %s, want EXPIRED", st)
	}
	s.Want(s.pay(late, "pi_late2", 1999, time.Now()), 409, "ORDER_EXPIRED")
	if got := s.events(late, "payment.refused"); len(got) != 2 || got[1] != (orderEvent{"payment.refused", "EXPIRED", "pi_late2", "ORDER_EXPIRED"}) {
		t.Fatalf("events %+v, want a second payment.refused of the EXPIRED order", got)
	}
	if rem := itemFigure(t, s.figures(saleID), item, "remaining"); rem != 3 {
		t.Fatalf("remaining = %d after the expiry, want 3 (the unit back once, not taken again)", rem)
	}
}

// TestShopPaymentConcurrent: callbacks of one payment id at once, each
// signed anew, all answer PAID and pay once (one event, one payment);
// copies of one signed request at once are accepted once and REPLAYED
// otherwise.
func TestShopPaymentConcurrent(t *testing.T) {
	s := startPayStack(t)
	saleID, items := s.createSale(5)
	orderID := s.bought(100, saleID, items[0])
	other := s.bought(101, saleID, items[0])
	now := time.Now()
	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			body := payBody("pi_same", 1999)
			statuses[i] = s.Do("POST", "/api/shop/orders/"+orderID+"/paid", "", body,
				"X-Flashsale-Signature", paySig(orderID, now.Add(-time.Duration(i)*time.Second), body)).Status
		})
	}
	wg.Wait()
	for i, st := range statuses {
		if st != 200 {
			t.Errorf("callback %d answered %d, want 200", i, st)
		}
	}
	if got := s.events(orderID, "order.paid", "payment.refused"); len(got) != 1 || got[0].Type != "order.paid" {
		t.Fatalf("events %+v, want one order.paid", got)
	}
	if p := s.payments(orderID); p != 1 {
		t.Fatalf("%d payments, want 1", p)
	}

	body := payBody("pi_copy", 1999)
	sig := paySig(other, now, body)
	codes := make([]string, n)
	for i := range n {
		wg.Go(func() {
			r := s.Do("POST", "/api/shop/orders/"+other+"/paid", "", body, "X-Flashsale-Signature", sig)
			codes[i] = fmt.Sprintf("%d %v", r.Status, r.Body["error"])
		})
	}
	wg.Wait()
	count := map[string]int{}
	for _, c := range codes {
		count[c]++
	}
	if count["200 <nil>"] != 1 || count["409 REPLAYED"] != n-1 {
		t.Fatalf("copies answered %v, want one 200 and %d REPLAYED", count, n-1)
	}
	if got := s.events(other, "order.paid", "payment.refused"); len(got) != 1 {
		t.Fatalf("events %+v, want one order.paid", got)
	}
}

// TestShopPaymentRacesExpiry sends each order's payment around the end of
// its window while the expiry worker runs: for every order exactly one of
// the two wins, the answer says which, and the stock holds: the paid
// orders' units sold, the others' back.
func TestShopPaymentRacesExpiry(t *testing.T) {
	const window, buyers = 3 * time.Second, 12
	s := startPayStack(t, func(c *wiring.Config) { c.PaymentWindow, c.ExpiryInterval = window, 20*time.Millisecond })
	saleID, items := s.createSale(buyers)
	item := items[0]
	type order struct {
		id      string
		expires time.Time
	}
	orders := make([]order, buyers)
	for i := range orders {
		id := s.bought(int64(100+i), saleID, item)
		o := s.Do("GET", "/api/flash-sales/orders/"+id, s.Token(int64(100+i), false), nil)
		exp, err := time.Parse(time.RFC3339Nano, fmt.Sprint(o.Body["expiresAt"]))
		if err != nil {
			t.Fatalf("order %s: %v", o.Raw, err)
		}
		orders[i] = order{id, exp}
	}
	answers := make([]apptest.Resp, buyers)
	var wg sync.WaitGroup
	for i, o := range orders {
		wg.Go(func() {
			// Spread around the window's end, from 200ms before to 200ms
			// after: some land before the worker, some after.
			at := o.expires.Add(time.Duration(i*400/(buyers-1)-200) * time.Millisecond)
			time.Sleep(time.Until(at))
			body := payBody(fmt.Sprintf("pi_race_%d", i), 1999)
			answers[i] = s.Do("POST", "/api/shop/orders/"+o.id+"/paid", "", body,
				"X-Flashsale-Signature", paySig(o.id, time.Now(), body))
		})
	}
	wg.Wait()
	var paid int64
	for i, o := range orders {
		a := answers[i]
		var st string
		testenv.Wait(15*time.Second, func() bool { st = s.dbStatus(o.id); return st != "PENDING" }) // the worker has yet to expire it
		evs := s.events(o.id, "order.paid", "order.expired", "payment.refused")
		switch {
		case a.Status == 200:
			paid++
			if st != "PAID" || len(evs) != 1 || evs[0].Type != "order.paid" {
				t.Errorf("order %d answered PAID but is %s with events %+v", i, st, evs)
			}
		case a.Status == 409 && a.Body["error"] == "ORDER_EXPIRED":
			var refused, expired int
			for _, e := range evs {
				switch e.Type {
				case "payment.refused":
					refused++
				case "order.expired":
					expired++
				default:
					t.Errorf("order %d: unexpected event %+v", i, e)
				}
			}
			// The worker's order.expired, and the callback's refusal.
			if st != "EXPIRED" || refused != 1 || expired != 1 {
				t.Errorf("order %d answered ORDER_EXPIRED but is %s with events %+v", i, st, evs)
			}
		default:
			t.Errorf("order %d: callback answered %d %s", i, a.Status, a.Raw)
		}
	}
	fig := s.figures(saleID)
	if rem, p := itemFigure(t, fig, item, "remaining"), itemFigure(t, fig, item, "paid"); p != paid || rem != buyers-paid {
		t.Fatalf("remaining %d, paid %d; want %d paid and the other %d back", rem, p, paid, buyers-paid)
	}
	t.Logf("%d of %d paid before their expiry", paid, buyers)
}

// TestShopPaymentURL: with FLASHSALE_PAYMENT_URL a payable order carries
// the shop's page and the simulated pay is refused; without a payment
// secret the callback route is off.
func TestShopPaymentURL(t *testing.T) {
	s := startPayStack(t, func(c *wiring.Config) { c.PaymentURL = "https://shop.example/pay/{orderId}?from=flashsale" })
	saleID, items := s.createSale(2)
	id := s.bought(100, saleID, items[0])
	shopper := s.Token(100, false)
	o := s.waitPayable(100, id)
	if want := "https://shop.example/pay/" + id + "?from=flashsale"; o.Body["paymentUrl"] != want {
		t.Fatalf("paymentUrl = %v, want %s", o.Body["paymentUrl"], want)
	}
	s.spec.call(false, "GET", "/api/flash-sales/orders/"+id, shopper, nil)
	s.spec.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), shopper, nil)
	r := s.spec.call(false, "POST", "/api/flash-sales/orders/"+id+"/pay", shopper, nil)
	s.Want(r, 403, "FORBIDDEN")
	if !strings.Contains(r.Body["message"].(string), "shop's payment page") {
		t.Fatalf("pay refusal %s", r.Raw)
	}
	s.wantPaid(s.pay(id, "pi_page", 1999, time.Now()), id, "pi_page")
	o = s.Do("GET", "/api/flash-sales/orders/"+id, shopper, nil)
	if _, ok := o.Body["paymentUrl"]; ok || o.Body["status"] != "PAID" {
		t.Fatalf("paid order %s: want PAID without paymentUrl", o.Raw)
	}

	off := startStack(t)
	body := payBody("pi_off", 1999)
	r = off.Do("POST", "/api/shop/orders/"+id+"/paid", "", body, "X-Flashsale-Signature", paySig(id, time.Now(), body))
	off.Want(r, http.StatusForbidden, "FORBIDDEN")
}

// TestShopPaymentNotYetStored: a payment for an order accepted (202) but
// not yet in PostgreSQL (no writer runs) is NOT_PAYABLE_YET and records
// its signature only: the very same request again is REPLAYED, the
// provider's retry signed anew NOT_PAYABLE_YET again.
func TestShopPaymentNotYetStored(t *testing.T) {
	cfg := wiring.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	rc := testenv.RedisConfig(t)
	cfg.RedisURL, cfg.RedisCluster = rc.URL, rc.Cluster
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.KafkaBrokers = testenv.NewKafka(t).Brokers
	cfg.JWTSecret, cfg.PaymentSecret = apptest.Secret, paySecret
	a, err := wiring.Start(context.Background(), cfg, wiring.Roles{Gateway: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := a.SetDefense(context.Background(), "test", []byte(apptest.Permissive)); err != nil {
		t.Fatal(err)
	}
	st := &stack{&apptest.Stack{T: t, App: a, Config: cfg, Client: &http.Client{Timeout: 10 * time.Second}}}
	pg, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	s := &payStack{stack: st, spec: newSpecCheck(t, st.Stack), pg: pg}

	saleID, items := s.createSale(2)
	r := s.purchase(100, items[0], s.admit(100, saleID))
	s.Want(r, 202, "")
	id := r.Body["orderId"].(string)
	body := payBody("pi_early", 1999)
	now := time.Now()
	sig := paySig(id, now, body)
	s.Want(s.callback(id, body, sig, true), 409, "NOT_PAYABLE_YET")
	s.Want(s.callback(id, body, sig, true), 409, "REPLAYED")
	s.Want(s.callback(id, body, paySig(id, now.Add(-time.Second), body), true), 409, "NOT_PAYABLE_YET")
	var sigs int
	if err := pg.QueryRow(context.Background(), `SELECT count(*) FROM payment_signatures`).Scan(&sigs); err != nil {
		t.Fatal(err)
	}
	if n, ev := s.payments(id), s.events(id, "order.paid", "payment.refused"); n != 0 || len(ev) != 0 || sigs != 2 || s.dbStatus(id) != "" {
		t.Fatalf("NOT_PAYABLE_YET recorded %d payments, %d signatures (want 2), events %v", n, sigs, ev)
	}
}
