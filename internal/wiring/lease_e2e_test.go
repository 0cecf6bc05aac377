package wiring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/lua"
)

// TestGatewayLostReservationsBack: a gateway process dies (kill -9) or
// freezes (SIGSTOP) with reservations whose orders it had not published
// yet (the broker holds its produce requests unanswered and unappended).
// Its placement lease lapses, and the other gateway settles every one of
// them within seconds of the loss: REJECTED with its unit back, since no
// record had reached the log. The reconcile bound is 10 minutes here, so
// without the lease nothing would come back during the test. Then the
// broker appends the held records, as a broker that was slow to answer
// would, and a frozen gateway wakes: nobody is answered 202 for a
// rejected order and nothing is doubled, because the late records meet
// the tombstones.
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
	broker := testenv.NewKafka(t)
	hold := newProduceHold(t, broker)
	s := startStack(t, func(c *wiring.Config) {
		c.KafkaBrokers = broker.Brokers
		c.ReconcileAfter = 10 * time.Minute
	})
	gw := startChild(t, "gateway", childConfig{RedisURL: s.Config.RedisURL, DatabaseURL: s.Config.DatabaseURL,
		KafkaBrokers: broker.Brokers, JWTSecret: apptest.Secret})
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
	// Warm-up buyers, one per producer of the gateway and again: Publish
	// takes the producers in turn.
	var warm []int64
	for i := range 2 * kafka.DefaultProducers {
		warm = append(warm, int64(90+i))
	}
	users := []int64{101, 102, 103, 104, 105, 106, 107, 108, 109, 110}
	tokens := map[int64]string{}
	for _, u := range append(warm, users...) {
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
	// purchase goes through it, and the broker learns its producer id.
	testenv.Eventually(t, "the gateway process's placement lease", 30*time.Second, func() bool {
		return leaseSlot(t, gwAdmin) > 0
	})
	hold.learn()
	for _, u := range warm {
		if code, _, err := buy(u); code != 202 {
			t.Fatalf("warm-up purchase through the gateway process: %d, %v", code, err)
		}
	}

	// The broker holds the gateway's produce requests: its purchases
	// reserve and wait for their publish.
	hold.start(t, kafka.DefaultProducers)
	defer hold.release()
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
		return err == nil && n == int64(len(warm)+len(users))
	})
	sig := syscall.SIGKILL
	if fault == "frozen" {
		sig = syscall.SIGSTOP
	}
	testenv.Eventually(t, "the gateway's records held by the broker", 30*time.Second, func() bool {
		return hold.count() > 0
	})
	gw.signal(t, sig)
	lost := time.Now()

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
		for _, u := range append(warm, users...) {
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
		if rejected != len(users) {
			t.Errorf("%s: %d of the lost gateway's %d reservations REJECTED, want all: their records were held", when, rejected, len(users))
		}
		t.Logf("%s, %v after the loss: %d live orders, %d REJECTED with their units back, %d units left", when, settled.Round(10*time.Millisecond), live, rejected, left)
		return st
	}
	before := check("settled")

	// The broker appends the held records (a dead gateway's too, as a
	// broker that read them before the connection closed would), and a
	// frozen gateway wakes: it answers none of the rejected orders 202,
	// and its late records change nothing.
	hold.release()
	if fault == "killed" {
		waitWriterCaughtUp(t, broker.Brokers)
		after := check("after the held records were appended")
		for u, st := range before {
			if after[u] != st {
				t.Errorf("user %d's order went from %s to %s after its record was appended", u, st, after[u])
			}
		}
		return
	}
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
	waitWriterCaughtUp(t, broker.Brokers)
	after := check("after the gateway woke")
	for u, st := range before {
		if after[u] != st {
			t.Errorf("user %d's order went from %s to %s after the gateway woke", u, st, after[u])
		}
	}
}

// waitWriterCaughtUp waits until the writer's group has committed past
// every record in the order log.
func waitWriterCaughtUp(t *testing.T, brokers []string) {
	t.Helper()
	ctx := context.Background()
	orders, err := kafka.NewOrderLog(kafka.OrderLogConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer orders.Close()
	testenv.Eventually(t, "the writer past every record, the late ones too", 30*time.Second, func() bool {
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
}

// produceHold makes the test's broker hold one process's records to the
// order topic, unanswered and unappended, until released, and then append
// them. It is the deterministic form of a frozen broker: a SIGSTOPped
// broker appends, at SIGCONT, whatever sat in its socket, so whether a
// lost gateway's records reached the log was up to the scheduler. The
// process is known by the producer ids of its record batches: those that
// produce to the order topic while learning.
type produceHold struct {
	c        *kfake.Cluster
	orders   [16]byte // the order topic's id (produce v13+ names topics by id)
	mu       sync.Mutex
	learning bool
	learned  map[int64]bool
	holding  bool
	held     int
	released chan struct{}
	once     sync.Once
}

func newProduceHold(t *testing.T, k *testenv.Kafka) *produceHold {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(context.Background(), flashsale.TopicOrders)
	if err != nil || topics.Error() != nil {
		t.Fatalf("the order topic's id: %v, %v", err, topics.Error())
	}
	h := &produceHold{c: k.Cluster, orders: topics[flashsale.TopicOrders].ID, learned: map[int64]bool{}, released: make(chan struct{})}
	k.Cluster.ControlKey(kmsg.Produce.Int16(), h.control)
	return h
}

func (h *produceHold) control(req kmsg.Request) (kmsg.Response, error, bool) {
	h.c.KeepControl()
	ids := h.producerIDs(req.(*kmsg.ProduceRequest))
	h.mu.Lock()
	hold := false
	for _, id := range ids {
		if h.learning {
			h.learned[id] = true
		}
		hold = hold || h.holding && h.learned[id]
	}
	if hold {
		h.held++
	}
	h.mu.Unlock()
	if hold {
		h.c.SleepControl(func() { <-h.released })
	}
	return nil, nil, false // appended and answered as usual
}

// producerIDs are the producer ids of a produce request's record batches
// to the order topic.
func (h *produceHold) producerIDs(req *kmsg.ProduceRequest) []int64 {
	var ids []int64
	for _, tp := range req.Topics {
		if tp.Topic != flashsale.TopicOrders && tp.TopicID != h.orders {
			continue
		}
		for _, p := range tp.Partitions {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(p.Records); err == nil && b.ProducerID >= 0 {
				ids = append(ids, b.ProducerID)
			}
		}
	}
	return ids
}

// learn makes every producer to the order topic from now until start one
// to hold.
func (h *produceHold) learn() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.learning = true
}

// start holds the learned producers' records from now on; want is how
// many producers the process has.
func (h *produceHold) start(t *testing.T, want int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.learned) != want {
		t.Fatalf("%d producers learned, want the gateway's %d", len(h.learned), want)
	}
	h.learning, h.holding = false, true
}

func (h *produceHold) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// release appends the held records and lets later ones through.
func (h *produceHold) release() {
	h.once.Do(func() {
		h.mu.Lock()
		h.holding = false
		h.mu.Unlock()
		close(h.released)
	})
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
