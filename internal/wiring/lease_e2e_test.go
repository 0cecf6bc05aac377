package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/lua"
)

// TestGatewayLostReservationsBack: a gateway process dies (kill -9) or
// freezes (SIGSTOP) with reservations whose orders it had not published
// yet (the broker, frozen meanwhile, held its produce requests). Its
// placement lease lapses, and the other gateway settles every one of them
// within seconds of the loss: the order is in the database when its
// record had reached the broker, REJECTED with its unit back when it had
// not. The reconcile bound is 10 minutes here, so without the lease
// nothing would come back during the test. A frozen gateway that wakes
// answers none of them 202 and doubles nothing: its late records meet the
// tombstones.
func TestGatewayLostReservationsBack(t *testing.T) {
	testenv.SkipOnCluster(t, "one Redis: the gateway process gets the stack's database by URL")
	for _, fault := range []string{"killed", "frozen"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			gatewayLost(t, fault)
		})
	}
}

func gatewayLost(t *testing.T, fault string) {
	ctx := context.Background()
	broker := startChild(t, "broker", childConfig{DataDir: t.TempDir()})
	s := startStack(t, func(c *wiring.Config) {
		c.KafkaBrokers = broker.addrs
		c.ReconcileAfter = 10 * time.Minute
	})
	gw := startChild(t, "gateway", childConfig{RedisURL: s.Config.RedisURL, DatabaseURL: s.Config.DatabaseURL,
		KafkaBrokers: broker.addrs, JWTSecret: apptest.Secret})
	gwPublic, gwAdmin := gw.addrs[0], gw.addrs[1]
	rdb, err := redisconn.New(redisconn.Config{URL: s.Config.RedisURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	pool, err := pgxpool.New(ctx, s.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	const quantity = 20
	saleID, items := s.createSale(quantity)
	item := items[0]
	users := []int64{101, 102, 103, 104, 105, 106, 107, 108, 109, 110}
	tokens := map[int64]string{}
	for _, u := range append([]int64{100}, users...) {
		tokens[u] = s.admit(u, saleID)
	}
	client := &http.Client{Timeout: 60 * time.Second}
	buy := func(u int64) (int, string, error) {
		req, err := http.NewRequest("POST", fmt.Sprintf("%s/api/flash-sales/items/%d/purchase", gwPublic, item), nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+s.Token(u, false))
		req.Header.Set("X-Admission-Token", tokens[u])
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var body struct {
			OrderID string `json:"orderId"`
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &body)
		return resp.StatusCode, body.OrderID, nil
	}
	// The gateway holds its lease and its producers are connected: one
	// purchase goes through it.
	testenv.Eventually(t, "the gateway process's placement lease", 30*time.Second, func() bool {
		return leaseSlot(t, gwAdmin) > 0
	})
	if code, _, err := buy(100); code != 202 {
		t.Fatalf("warm-up purchase through the gateway process: %d, %v", code, err)
	}

	// The broker freezes: the gateway's purchases reserve and wait for
	// their publish.
	broker.signal(t, syscall.SIGSTOP)
	type answer struct {
		user    int64
		code    int
		orderID string
		err     error
	}
	answers := make(chan answer, len(users))
	for _, u := range users {
		go func() {
			code, id, err := buy(u)
			answers <- answer{u, code, id, err}
		}()
	}
	buyers := lua.BuyersKey(saleID)
	testenv.Eventually(t, "the gateway's reservations made", 30*time.Second, func() bool {
		n, err := rdb.HLen(ctx, buyers).Result()
		return err == nil && n == int64(1+len(users))
	})
	sig := syscall.SIGKILL
	if fault == "frozen" {
		sig = syscall.SIGSTOP
	}
	gw.signal(t, sig)
	lost := time.Now()
	broker.signal(t, syscall.SIGCONT)

	// Every reservation the gateway had in flight is settled: none left
	// pending in Redis.
	pending := lua.PendingKey(saleID)
	testenv.EventuallyF(t, func() string {
		n, _ := rdb.ZCard(ctx, pending).Result()
		return fmt.Sprintf("the lost gateway's reservations settled (%d pending)", n)
	}, 60*time.Second, func() bool {
		n, err := rdb.ZCard(ctx, pending).Result()
		return err == nil && n == 0
	})
	settled := time.Since(lost)
	statuses := func() map[int64]string {
		rows, err := pool.Query(ctx, `SELECT user_id, status FROM orders WHERE sale_id = $1`, saleID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[int64]string{}
		for rows.Next() {
			var u int64
			var st string
			if err := rows.Scan(&u, &st); err != nil {
				t.Fatal(err)
			}
			m[u] = st
		}
		return m
	}
	// The units: every user has one row, live (its record reached the
	// broker) or REJECTED (its unit back), and stock adds up.
	check := func(when string) map[int64]string {
		t.Helper()
		st := statuses()
		live, rejected := 0, 0
		for _, u := range append([]int64{100}, users...) {
			switch st[u] {
			case "PENDING":
				live++
			case "REJECTED":
				rejected++
			default:
				t.Errorf("%s: user %d's order is %q, want PENDING or REJECTED", when, u, st[u])
			}
		}
		left, err := rdb.HGet(ctx, lua.StockKey(saleID), fmt.Sprint(item)).Int()
		if err != nil {
			t.Fatal(err)
		}
		if left+live != quantity {
			t.Errorf("%s: %d units left and %d live orders, want %d in all", when, left, live, quantity)
		}
		if rejected == 0 {
			t.Errorf("%s: no reservation was lost with the gateway (all %d reached the broker): the fault tested nothing", when, live)
		}
		t.Logf("%s, %v after the loss: %d live orders, %d REJECTED with their units back, %d units left", when, settled.Round(10*time.Millisecond), live, rejected, left)
		return st
	}
	before := check("settled")

	if fault == "killed" {
		return
	}
	// The gateway wakes: it answers none of the rejected orders 202, and
	// its late records change nothing.
	gw.signal(t, syscall.SIGCONT)
	for range users {
		a := <-answers
		if a.err != nil {
			t.Errorf("user %d: %v", a.user, a.err)
			continue
		}
		if a.code == 202 && before[a.user] != "PENDING" {
			t.Errorf("user %d answered 202 (order %s) by the woken gateway, but the order is %s", a.user, a.orderID, before[a.user])
		}
	}
	orders, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: broker.addrs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(orders.Close)
	testenv.Eventually(t, "the writer past every record, the woken gateway's too", 30*time.Second, func() bool {
		committed, end, err := orders.Progress(ctx)
		if err != nil {
			return false
		}
		for p, e := range end {
			if committed[p] < e {
				return false
			}
		}
		return true
	})
	after := check("after the gateway woke")
	for u, st := range before {
		if after[u] != st {
			t.Errorf("user %d's order went from %s to %s after the gateway woke", u, st, after[u])
		}
	}
}

// leaseSlot reads flashsale_purchase_lease_slot from a gateway's admin
// port (0 when unreadable).
func leaseSlot(t *testing.T, admin string) int {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "flashsale_purchase_lease_slot "); ok {
			var n int
			_, _ = fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}
