package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// hookLog is a shop's webhook endpoint: it verifies each request and keeps
// the events it accepted, order and shopper events apart.
type hookLog struct {
	t        *testing.T
	secret   []byte
	mu       sync.Mutex
	events   []events.Event
	shoppers []events.ShopperEvent
}

func (h *hookLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if _, err := events.Verify(h.secret, r.Header.Get(events.SignatureHeader), body, time.Now(), 5*time.Minute); err != nil {
		h.t.Errorf("webhook: %v", err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var ev events.Event
	if err := json.Unmarshal(body, &ev); err != nil || r.Header.Get(events.WebhookEventIDHeader) != strconv.FormatInt(ev.EventID, 10) {
		h.t.Errorf("webhook: body %s (%v), id header %q", body, err, r.Header.Get(events.WebhookEventIDHeader))
	}
	h.mu.Lock()
	if ev.Type == events.TypeShopperAdmitted {
		var se events.ShopperEvent
		if err := json.Unmarshal(body, &se); err != nil {
			h.t.Errorf("webhook: body %s: %v", body, err)
		}
		h.shoppers = append(h.shoppers, se)
	} else {
		h.events = append(h.events, ev)
	}
	h.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// typesByOrder groups event types by order, in eventId order.
func typesByOrder(evs []events.Event) map[string][]string {
	evs = slices.Clone(evs)
	slices.SortFunc(evs, func(a, b events.Event) int { return int(a.EventID - b.EventID) })
	out := map[string][]string{}
	for _, ev := range evs {
		out[ev.OrderID] = append(out[ev.OrderID], string(ev.Type))
	}
	return out
}

// A real sale: one order paid, one cancelled, one left to expire. The
// order-events topic and the webhook both carry each order's changes, once
// each, in order; the webhook is told of the shoppers' turns too.
func TestOrderEventsEndToEnd(t *testing.T) {
	hook := &hookLog{t: t, secret: []byte("e2e-webhook-secret-0123456789abcdef")}
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	s := startStack(t, func(c *wiring.Config) {
		c.WebhookURL, c.WebhookSecret = srv.URL, string(hook.secret)
	})
	saleID, items := s.createSale(5)
	item := items[0]
	orderOf := func(user int64) string {
		r := s.purchase(user, item, s.admit(user, saleID))
		s.Want(r, 202, "")
		id := r.Body["orderId"].(string)
		s.waitPayable(user, id)
		return id
	}
	paid, cancelled, expired := orderOf(100), orderOf(200), orderOf(300)
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+paid+"/pay", s.Token(100, false), nil), 200, "")
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+paid+"/pay", s.Token(100, false), nil), 200, "") // no second event
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+cancelled+"/cancel", s.Token(200, false), nil), 200, "")
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+cancelled+"/pay", s.Token(200, false), nil), 409, "ORDER_CANCELLED")
	// The third order's window has passed (moved back in the database):
	// the expiry worker expires it.
	pool, err := pgxpool.New(context.Background(), s.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `UPDATE orders SET expires_at = now() - interval '1 second' WHERE id = $1`, expired); err != nil {
		t.Fatal(err)
	}

	want := map[string][]string{
		paid:      {"order.pending", "order.paid"},
		cancelled: {"order.pending", "order.cancelled"},
		expired:   {"order.pending", "order.expired"},
	}
	// The topic, read from the start until it holds the six events.
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Config.KafkaBrokers...),
		kgo.ConsumeTopics(flashsale.TopicOrderEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var onTopic []events.Event
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(onTopic) < 6 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			var ev events.Event
			if err := json.Unmarshal(rec.Value, &ev); err != nil {
				t.Errorf("record %s: %v", rec.Value, err)
			}
			if string(rec.Key) != ev.OrderID || ev.SaleID != saleID || ev.ItemID != item || ev.Version != 1 {
				t.Errorf("record key %s, event %+v", rec.Key, ev)
			}
			onTopic = append(onTopic, ev)
		})
	}
	if got := typesByOrder(onTopic); len(got) != 3 || !slices.Equal(got[paid], want[paid]) ||
		!slices.Equal(got[cancelled], want[cancelled]) || !slices.Equal(got[expired], want[expired]) {
		t.Errorf("topic events by order: %v, want %v", got, want)
	}
	for _, ev := range onTopic {
		if ev.OrderID == paid && ev.Type == events.TypePaid && (ev.UserID != 100 || ev.Status != flashsale.OrderPaid || ev.PriceCents != 1999) {
			t.Errorf("paid event %+v", ev)
		}
	}

	var n int
	var got map[string][]string
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("6 webhook events %v (got %v)", want, got) }, 60*time.Second, func() bool {
		hook.mu.Lock()
		defer hook.mu.Unlock()
		n, got = len(hook.events), typesByOrder(hook.events)
		return n >= 6
	})
	if n != 6 || !slices.Equal(got[paid], want[paid]) || !slices.Equal(got[cancelled], want[cancelled]) || !slices.Equal(got[expired], want[expired]) {
		t.Errorf("webhook got %d events: %v, want %v", n, got, want)
	}
	// Users 200 and 300 joined after the leader's first look at the sale
	// (user 100 may have been admitted in it, which tells nothing).
	turns := map[int64]events.ShopperEvent{}
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("shopper.admitted for users 200 and 300 (got %v)", turns) }, 60*time.Second, func() bool {
		hook.mu.Lock()
		defer hook.mu.Unlock()
		for _, se := range hook.shoppers {
			if _, dup := turns[se.UserID]; dup {
				t.Errorf("user %d told twice: %+v", se.UserID, se)
			}
			turns[se.UserID] = se
		}
		hook.shoppers = hook.shoppers[:0]
		_, ok200 := turns[200]
		_, ok300 := turns[300]
		return ok200 && ok300
	})
	for u, se := range turns {
		if se.SaleID != saleID || se.Kind != flashsale.TurnAdmitted || se.Version != 1 || (u != 100 && u != 200 && u != 300) {
			t.Errorf("shopper event %+v", se)
		}
	}
	if turns[200].Place >= turns[300].Place {
		t.Errorf("user 200 at place %d, user 300 at %d: want join order", turns[200].Place, turns[300].Place)
	}
}
