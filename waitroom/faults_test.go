package waitroom

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

// killable is a gateway with its own Redis client, which the test can
// kill: its room stops (no tick, no presence mark), its Redis client is
// closed (nothing it would still do reaches Redis, as with kill -9), and
// its connections drop.
type killable struct {
	*gateway
	rdb    redis.UniversalClient
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func (e *env) newKillable(cfg Config, opt *redis.Options) *killable {
	e.t.Helper()
	e.testDefaults(&cfg)
	// A client of its own (same server, or the same cluster), so that
	// killing the gateway drops its connections alone.
	var rdb redis.UniversalClient
	if c, ok := e.rdb.(*redis.ClusterClient); ok && opt == nil {
		rdb = redis.NewClusterClient(c.Options())
	} else {
		if opt == nil {
			opt = e.rdb.(*redis.Client).Options()
		}
		rdb = redis.NewClient(opt)
	}
	reg := prometheus.NewRegistry()
	r := New(cfg, rdb, e.sales, e.stock, e.access, e.signer, nil, nil, reg)
	ctx, cancel := context.WithCancel(context.Background())
	k := &killable{rdb: rdb, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(k.done); _ = r.Run(ctx) }()
	k.gateway = &gateway{room: r, srv: httptest.NewServer(r), reg: reg}
	e.t.Cleanup(k.kill)
	return k
}

// kill stops the gateway at once.
func (k *killable) kill() {
	k.once.Do(func() {
		k.cancel()
		<-k.done
		_ = k.rdb.Close()
		k.srv.CloseClientConnections()
		k.srv.Close()
	})
}

// leads reports whether the gateway leads the sale's queue.
func (g *gateway) leads(saleID int64) bool {
	sr := g.room.saleRoom(saleID, false)
	if sr == nil {
		return false
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.leadAt >= 0
}

// buy stands in for a purchase: one unit less, then the buyer record and
// the reservation counter (the unit first, as in buyOnHome).
func (e *env) buy(saleID, itemID, user int64) {
	e.t.Helper()
	ctx := context.Background()
	e.stock.mu.Lock()
	e.stock.m[saleID][itemID]--
	e.stock.mu.Unlock()
	if err := e.rdb.HSet(ctx, lua.BuyersKey(saleID), user, "order-"+strconv.FormatInt(user, 10)+"|"+strconv.FormatInt(itemID, 10)+"|1").Err(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.rdb.Incr(ctx, lua.ReservedKey(saleID)).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// TestGoneAdmittedFreesPlace: the capacity cap holds 2 places for 2 units.
// The gateway holding both admitted shoppers dies (and led the queue). One
// of them comes back on the other gateway within the grace period and
// keeps its token; the other stays away: after the grace period its place
// no longer counts, the next shopper is admitted (the surviving gateway
// took the lead), and the sale sells out.
func TestGoneAdmittedFreesPlace(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 31, e.clock.Now().Add(-time.Millisecond), 10, 2))
	item := sale.Items[0].ID
	cfg := Config{AdmissionTTL: 5 * time.Minute, CapacityFactor: 1, AdmittedGrace: 20 * time.Second, LeaseTTL: 200 * time.Millisecond}
	a := e.newKillable(cfg, nil)
	u1, u2 := dial(t, a.url(sale.ID)), dial(t, a.url(sale.ID))
	u1.join(e.token(1))
	u1.untilState(StateWaiting)
	u2.join(e.token(2))
	u2.untilState(StateWaiting)
	eventually(t, "gateway a leads", hangBound, func() bool { return a.leads(sale.ID) })
	b := e.newGateway(cfg, nil)
	u3, u4 := dial(t, b.url(sale.ID)), dial(t, b.url(sale.ID))
	u3.join(e.token(3))
	if m := u3.untilState(StateWaiting); m.Position != 2 {
		t.Fatalf("u3: %+v", m)
	}
	u4.join(e.token(4))
	u4.untilState(StateWaiting)

	e.clock.Advance(time.Second) // rate 10/s, cap 2: users 1 and 2
	tok1 := u1.untilAdmitted().AdmissionToken
	u2.untilAdmitted()
	a.kill()

	// 10 s later user 1 is back, on the other gateway: the same token.
	e.clock.Advance(10 * time.Second)
	b.waitTicks(t, 3)
	if got := b.admitted(t, sale.ID); got != 2 {
		t.Fatalf("admitted %d within the grace period, want 2", got)
	}
	u1b := dial(t, b.url(sale.ID))
	u1b.join(e.token(1))
	if m := u1b.untilAdmitted(); m.AdmissionToken != tok1 {
		t.Fatal("user 1 back on another gateway got another token")
	}

	// Past user 2's grace period: its place is free, user 1's is not.
	e.clock.Advance(11 * time.Second)
	u3.untilAdmitted()
	b.waitTicks(t, 5)
	if got := b.admitted(t, sale.ID); got != 3 {
		t.Fatalf("admitted %d, want 3 (user 2 gone, user 1 back)", got)
	}
	e.buy(sale.ID, item, 1)
	e.buy(sale.ID, item, 3)
	for _, c := range []*client{u1b, u3, u4} {
		c.untilState(StateSoldOut)
	}
}

// TestGoneCountedInTheBucketThatCounted: an admission record's time is the
// telling gateway's, and a broadcast may run on a tick time older than
// the leader's count (or tell later), so the record may name a second
// whose bucket counted no admission. The shopper, once away past the
// grace period, is still counted gone, in the nearest bucket that did:
// before, its presence was dropped and its place held until the bucket
// aged out with the token's life, and nobody behind it was admitted.
func TestGoneCountedInTheBucketThatCounted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sale := e.addSale(newSale(t, 32, e.clock.Now().Add(-time.Millisecond), 10, 100))
	g := e.newGateway(Config{AdmissionTTL: time.Hour, AdmittedGrace: 2 * time.Second}, nil)
	early, late := int64(11), int64(12)
	for _, u := range []int64{early, late} {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second) // rate 10/s: both admitted in one bucket
	for _, u := range []int64{early, late} {
		eventually(t, "admitted", 5*time.Second, func() bool {
			st, err := g.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
			return err == nil && st.State == StateAdmitted
		})
	}
	// The records as a lagging broadcast (a second early) and a late
	// teller (a second late) would have written them.
	admitted := lua.QueueKey(sale.ID, keyAdmitted)
	for u, shift := range map[int64]int64{early: -1000, late: 1000} {
		rec, err := e.rdb.HGet(ctx, admitted, strconv.FormatInt(u, 10)).Result()
		if err != nil {
			t.Fatal(err)
		}
		place, at, err := parseAdmission(rec)
		if err != nil {
			t.Fatal(err)
		}
		moved := strconv.FormatInt(place, 10) + "|" + strconv.FormatInt(at+shift, 10)
		if err := e.rdb.HSet(ctx, admitted, u, moved).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Both stop polling: after the grace period their presence lapses.
	e.clock.Advance(3 * time.Second)
	gone := lua.QueueKey(sale.ID, keyGone)
	for _, u := range []int64{early, late} {
		eventually(t, fmt.Sprintf("user %d counted gone", u), 5*time.Second, func() bool {
			ok, err := e.rdb.HExists(ctx, gone, strconv.FormatInt(u, 10)).Result()
			return err == nil && ok
		})
	}
	b, err := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyBuckets)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var a, gn int
	for f, v := range b {
		n, _ := strconv.Atoi(v)
		switch f[0] {
		case 'a':
			a += n
		case 'g':
			gn += n
		}
	}
	if a != 2 || gn != 2 {
		t.Errorf("buckets %v: %d admissions and %d gone, want 2 and 2 (both counted where they were admitted)", b, a, gn)
	}
}

// restartableRedis is a redis-server the test may kill and start again,
// empty, on the same port.
type restartableRedis struct {
	t   *testing.T
	srv *localsvc.Redis
}

func newRestartableRedis(t *testing.T) *restartableRedis {
	return &restartableRedis{t: t, srv: testenv.NewRedisServer(t)}
}

func (r *restartableRedis) options() *redis.Options {
	return &redis.Options{Addr: r.srv.Addr, MaxRetries: -1, DialTimeout: time.Second}
}

// restartEmpty kills redis-server (kill -9: nothing saved) and starts an
// empty one on the same port.
func (r *restartableRedis) restartEmpty() {
	r.t.Helper()
	r.srv.Kill()
	port, err := strconv.Atoi(r.srv.Addr[strings.LastIndexByte(r.srv.Addr, ':')+1:])
	if err != nil {
		r.t.Fatal(err)
	}
	srv, err := localsvc.StartRedis(context.Background(), localsvc.RedisOptions{Dir: r.t.TempDir(), Port: port})
	if err != nil {
		r.t.Fatal(err)
	}
	r.srv = srv
	r.t.Cleanup(func() { srv.Stop() })
}

// newFaultEnv is an env on a dedicated redis-server.
func newFaultEnv(t *testing.T, rr *restartableRedis) *env {
	e := newEnv(t)
	e.rdb = redis.NewClient(rr.options())
	t.Cleanup(func() { e.rdb.Close() })
	return e
}

// TestRedisEmptyRestartRestoresQueue: 30 shoppers pre-queued (10 over
// WebSockets on each of two gateways, 10 polling), 6 admitted; then
// redis-server is killed and started empty. The queue comes back from the
// checkpoint in PostgreSQL and the gateways' connections: admission
// resumes at the next tick, every shopper keeps its place (the draw
// checked against the published seed), and the admitted keep their
// tokens.
func TestRedisEmptyRestartRestoresQueue(t *testing.T) {
	rr := newRestartableRedis(t)
	e := newFaultEnv(t, rr)
	pool := testenv.Postgres(t)
	opens := e.clock.Now().Add(time.Minute)
	sale := e.addSale(newSale(t, 41, opens, 6, 1000))
	cfg := Config{AdmissionTTL: 5 * time.Minute, Durable: NewPGDurable(pool), CheckpointEvery: 20 * time.Millisecond}
	gws := []*killable{e.newKillable(cfg, rr.options()), e.newKillable(cfg, rr.options())}
	ctx := context.Background()
	ws := map[int64]*client{}
	for u := int64(1); u <= 20; u++ {
		c := dial(t, gws[u%2].url(sale.ID))
		c.join(e.token(u))
		c.untilState(StatePrequeue)
		ws[u] = c
	}
	for u := int64(21); u <= 30; u++ {
		if _, err := gws[u%2].room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Minute) // open: the draw
	placeOf := map[int64]int64{}
	for u, c := range ws {
		m := c.untilState(StateWaiting)
		placeOf[u] = m.Position
	}
	e.clock.Advance(time.Second) // 6 admitted
	tokens := map[int64]string{}
	for u, c := range ws {
		if placeOf[u] < 6 {
			tokens[u] = c.untilAdmitted().AdmissionToken
		}
	}
	// The checkpoint holds the draw's 30 tickets and the cursor.
	waitCheckpoint(t, pool, sale.ID, 30, 30, 6)
	before, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !before.OK {
		t.Fatalf("VerifyDraw before = %+v, %v", before, err)
	}

	rr.restartEmpty()
	// The next tick restores; the next second admits 6 more.
	eventually(t, "the queue restored", 10*time.Second, func() bool {
		n, err := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyState), fieldN).Int64()
		return err == nil && n == 30
	})
	e.clock.Advance(time.Second)
	eventually(t, "12 admitted", 10*time.Second, func() bool {
		f, err := gws[0].room.Figures(ctx, sale.ID)
		return err == nil && f.Admitted == 12 && f.Joined == 30
	})
	// Connected shoppers kept their places: those at places 6..11 are
	// admitted now, the rest wait at the same distance; the admitted keep
	// their tokens.
	for u, c := range ws {
		switch p := placeOf[u]; {
		case p < 6:
		case p < 12:
			c.untilAdmitted()
		default:
			c.until("position after the restore", 10*time.Second, func(m msg) bool {
				return m.Type == TypeStatus && m.State == StateWaiting && m.Position == p-12
			})
		}
	}
	for u, tok := range tokens {
		again := dial(t, gws[0].url(sale.ID))
		again.join(e.token(u))
		if m := again.untilAdmitted(); m.AdmissionToken != tok {
			t.Fatalf("user %d got another token after the restore", u)
		}
		break
	}
	// Polling shoppers are found again, at their places.
	eventually(t, "30 admitted", 10*time.Second, func() bool {
		e.clock.Advance(100 * time.Millisecond)
		f, err := gws[1].room.Figures(ctx, sale.ID)
		return err == nil && f.Admitted == 30
	})
	for u, c := range ws {
		if placeOf[u] >= 12 {
			c.untilAdmitted()
		}
	}
	// Each gateway answers a poll from the cursor it saw at its last tick.
	for u := int64(21); u <= 30; u++ {
		eventually(t, fmt.Sprintf("polling user %d admitted after the restore", u), 10*time.Second, func() bool {
			st, err := gws[u%2].room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
			return err == nil && st.State == StateAdmitted
		})
	}
	after, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !after.OK || after.Checked != 30 {
		t.Fatalf("VerifyDraw after the restore = %+v, %v", after, err)
	}
	for i := range before.Order {
		if before.Order[i] != after.Order[i] {
			t.Fatalf("place %d: user %d before the restore, %d after", i, before.Order[i], after.Order[i])
		}
	}
}

// TestFailoverToStaleReplica: the queue's Redis fails over to a replica
// that missed the last writes (joins after the opening and a move of the
// cursor). The gateways find it behind what they know and bring it up to
// date: later joiners keep their tickets, the cursor does not go back.
func TestFailoverToStaleReplica(t *testing.T) {
	master := newRestartableRedis(t)
	replica := newRestartableRedis(t)
	ctx := context.Background()
	rep := redis.NewClient(replica.options())
	defer rep.Close()
	host, port, _ := strings.Cut(master.srv.Addr, ":")
	if err := rep.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	// Every gateway dials the current primary.
	var mu sync.Mutex
	primary := master.srv.Addr
	opt := master.options()
	opt.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
		mu.Lock()
		addr := primary
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	e := newEnv(t)
	e.rdb = redis.NewClient(opt)
	t.Cleanup(func() { e.rdb.Close() })
	sale := e.addSale(newSale(t, 42, e.clock.Now().Add(time.Second), 4, 1000))
	cfg := Config{AdmissionTTL: 5 * time.Minute}
	gws := []*killable{e.newKillable(cfg, opt), e.newKillable(cfg, opt)}
	var clients []*client
	for u := int64(1); u <= 8; u++ {
		c := dial(t, gws[u%2].url(sale.ID))
		c.join(e.token(u))
		c.untilState(StatePrequeue)
		clients = append(clients, c)
	}
	e.clock.Advance(time.Second) // open
	for _, c := range clients {
		c.untilState(StateWaiting)
	}
	// The replica has all of that; then it is cut off and promoted, and
	// the master goes on: 4 later joiners and 4 admissions it never sees.
	eventually(t, "replica in sync", 10*time.Second, func() bool {
		n, err := rep.HGet(ctx, lua.QueueKey(sale.ID, keyState), fieldN).Int64()
		return err == nil && n == 8
	})
	if err := rep.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	late := map[int64]*client{}
	for u := int64(9); u <= 12; u++ {
		c := dial(t, gws[u%2].url(sale.ID))
		c.join(e.token(u))
		if m := c.untilState(StateWaiting); m.Position != u-1 {
			t.Fatalf("late joiner %d: %+v", u, m)
		}
		late[u] = c
	}
	e.clock.Advance(time.Second) // 4 admitted on the master
	eventually(t, "4 admitted", 10*time.Second, func() bool { return gws[0].admitted(t, sale.ID) == 4 })
	gws[0].waitTicks(t, 2)
	gws[1].waitTicks(t, 2)

	mu.Lock()
	primary = replica.srv.Addr
	mu.Unlock()
	master.srv.Kill()
	eventually(t, "the replica brought up to date", 10*time.Second, func() bool {
		v, err := rep.HMGet(ctx, lua.QueueKey(sale.ID, keyState), fieldSeq, fieldServing).Result()
		return err == nil && toInt(v[0]) == 12 && toInt(v[1]) >= 4
	})
	// A new joiner queues behind the late joiners, who keep their places.
	c13 := dial(t, gws[1].url(sale.ID))
	c13.join(e.token(13))
	c13.untilState(StateWaiting)
	for u := int64(9); u <= 13; u++ {
		if tk, err := rep.HGet(ctx, lua.QueueKey(sale.ID, keyTickets), strconv.FormatInt(u, 10)).Int64(); err != nil || tk != u-1 {
			t.Fatalf("user %d: ticket %d (%v), want %d", u, tk, err, u-1)
		}
	}
	eventually(t, "13 admitted", 10*time.Second, func() bool {
		e.clock.Advance(100 * time.Millisecond)
		return gws[1].admitted(t, sale.ID) >= 13
	})
	for _, c := range late {
		c.untilAdmitted()
	}
	c13.untilAdmitted()
	rep2, err := VerifyDraw(ctx, rep, sale)
	if err != nil || !rep2.OK {
		t.Fatalf("VerifyDraw after the failover = %+v, %v", rep2, err)
	}
}

// TestStockMissingIsUnknown: while one item's stock record is missing (a
// Redis that lost it, before the rebuild), the room neither says SOLD_OUT
// nor admits; once the record is back, admission goes on.
func TestStockMissingIsUnknown(t *testing.T) {
	e := newEnv(t)
	sale := newSale(t, 43, e.clock.Now().Add(-time.Millisecond), 10, 5)
	sale.Items = append(sale.Items, flashsale.Item{ID: sale.ID*1000 + 2, SaleID: sale.ID, ProductID: 502, Quantity: 5, PriceCents: 999})
	e.addSale(sale)
	g := e.newGateway(Config{}, nil)
	c := joined(t, e, g, sale.ID, 1, StateWaiting)[0]
	// The first item sold out; the second's record is gone.
	e.stock.set(sale.ID, sale.Items[0].ID, 0)
	e.stock.mu.Lock()
	delete(e.stock.m[sale.ID], sale.Items[1].ID)
	e.stock.mu.Unlock()
	e.clock.Advance(time.Second)
	g.waitTicks(t, 5)
	if st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: 1}, sale.ID); err != nil || st.State != StateWaiting {
		t.Fatalf("status while a stock record is missing: %+v, %v; want WAITING", st, err)
	}
	if got := g.admitted(t, sale.ID); got != 0 {
		t.Fatalf("admitted %d while the stock is unknown", got)
	}
	e.stock.set(sale.ID, sale.Items[1].ID, 5)
	e.clock.Advance(time.Second)
	c.untilAdmitted()
}

// TestReconnectAfterGatewayDies: shoppers whose gateway dies join again on
// the other one and keep their places: the waiting ones their positions,
// the admitted one its token.
func TestReconnectAfterGatewayDies(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 44, e.clock.Now().Add(time.Second), 1, 100))
	cfg := Config{AdmissionTTL: 5 * time.Minute, LeaseTTL: 200 * time.Millisecond}
	a, b := e.newKillable(cfg, nil), e.newGateway(cfg, nil)
	var onA []*client
	for u := int64(1); u <= 6; u++ {
		url := a.url(sale.ID)
		if u > 4 {
			url = b.url(sale.ID)
		}
		c := dial(t, url)
		c.join(e.token(u))
		c.untilState(StatePrequeue)
		if u <= 4 {
			onA = append(onA, c)
		}
	}
	e.clock.Advance(time.Second) // open
	place := map[int64]int64{}
	for i, c := range onA {
		place[int64(i+1)] = c.untilState(StateWaiting).Position
	}
	e.clock.Advance(time.Second) // rate 1/s: the first place
	eventually(t, "one admitted", 10*time.Second, func() bool { return b.admitted(t, sale.ID) == 1 })
	var first int64
	var tok string
	for u, p := range place {
		if p == 0 {
			first, tok = u, onA[u-1].untilAdmitted().AdmissionToken
		}
	}
	b.waitTicks(t, 2)
	a.kill()
	for u, p := range place {
		c := dial(t, b.url(sale.ID))
		c.join(e.token(u))
		if u == first {
			if m := c.untilAdmitted(); m.AdmissionToken != tok {
				t.Fatalf("user %d: another token on the other gateway", u)
			}
			continue
		}
		if m := c.untilState(StateWaiting); m.Position != p-1 {
			sr := b.room.saleRoom(sale.ID, false)
			sr.mu.Lock()
			st := sr.st
			sr.mu.Unlock()
			state, _ := e.rdb.HGetAll(context.Background(), lua.QueueKey(sale.ID, keyState)).Result()
			t.Fatalf("user %d: position %d on the other gateway, want %d; b %+v, redis %v, places %v", u, m.Position, p-1, st, state, place)
		}
	}
}

// TestRestoreFromCheckpointAlone: Redis restarts empty while no gateway
// that knew the queue is left; a freshly started gateway finds the
// checkpoint before its first tick and restores the queue from it, so
// polling shoppers keep their places and the cursor its position.
func TestRestoreFromCheckpointAlone(t *testing.T) {
	rr := newRestartableRedis(t)
	e := newFaultEnv(t, rr)
	pool := testenv.Postgres(t)
	sale := e.addSale(newSale(t, 45, e.clock.Now().Add(time.Second), 3, 100))
	cfg := Config{AdmissionTTL: 5 * time.Minute, Durable: NewPGDurable(pool), CheckpointEvery: 20 * time.Millisecond}
	a := e.newKillable(cfg, rr.options())
	ctx := context.Background()
	for u := int64(1); u <= 10; u++ {
		if _, err := a.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(time.Second) // open
	a.waitTicks(t, 2)
	e.clock.Advance(time.Second) // 3 admitted
	waitCheckpoint(t, pool, sale.ID, 10, 10, 3)
	before, err := VerifyDraw(ctx, e.rdb, sale)
	if err != nil || !before.Drawn {
		t.Fatalf("VerifyDraw before = %+v, %v", before, err)
	}
	a.kill()
	rr.restartEmpty()

	b := e.newKillable(cfg, rr.options())
	for place, u := range before.Order {
		st, err := b.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
		if err != nil {
			t.Fatalf("user %d after the restore: %v", u, err)
		}
		bad := place >= 3 && (st.State != StateWaiting || st.Position != int64(place)-3) || place < 3 && st.State != StateAdmitted
		if bad {
			state, _ := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyState)).Result()
			tickets, _ := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyTickets)).Result()
			order, _ := e.rdb.LRange(ctx, lua.QueueKey(sale.ID, keyOrder), 0, -1).Result()
			t.Fatalf("user %d at place %d after the restore: %+v; state %v tickets %v order %v before %v",
				u, place, st, state, tickets, order, before.PreQueue)
		}
	}
}

// TestRestoredHolesDoNotHoldCapacity: without a checkpoint, an empty
// Redis restart loses the tickets of shoppers no gateway holds a
// connection of (polling ones). Their places stay empty; the cursor
// passes them without counting them against the capacity cap, so the
// connected shoppers behind them are admitted.
func TestRestoredHolesDoNotHoldCapacity(t *testing.T) {
	rr := newRestartableRedis(t)
	e := newFaultEnv(t, rr)
	sale := e.addSale(newSale(t, 46, e.clock.Now().Add(-time.Millisecond), 100, 2))
	g := e.newKillable(Config{AdmissionTTL: 5 * time.Minute, CapacityFactor: 1}, rr.options())
	ctx := context.Background()
	s2 := *sale
	s2.AdmissionRatePerSecond = 0 // nobody admitted before the fault
	e.sales.put(&s2)
	for u := int64(1); u <= 4; u++ {
		if _, err := g.room.Join(ctx, flashsale.Principal{UserID: u}, sale.ID, testIP, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	c5, c6 := dial(t, g.url(sale.ID)), dial(t, g.url(sale.ID))
	c5.join(e.token(5))
	c5.untilState(StateWaiting)
	c6.join(e.token(6))
	if m := c6.untilState(StateWaiting); m.Position != 5 {
		t.Fatalf("c6: %+v", m)
	}
	g.waitTicks(t, 2)

	rr.restartEmpty()
	eventually(t, "the queue restored", 10*time.Second, func() bool {
		n, err := e.rdb.HGet(ctx, lua.QueueKey(sale.ID, keyState), fieldSeq).Int64()
		return err == nil && n == 6
	})
	e.sales.put(sale)
	eventually(t, "all six places admitted", 10*time.Second, func() bool {
		e.clock.Advance(100 * time.Millisecond)
		return g.admitted(t, sale.ID) == 6
	})
	c5.untilAdmitted()
	c6.untilAdmitted()
}

// gauge is the value of the gateway's unlabelled gauge name (-1: none).
func (g *gateway) gauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestLeadingSalesGauge: of two gateways serving one sale, the one that
// holds the leader lease says so on flashsale_waitroom_leading_sales and
// the other says 0; when the leader dies the other takes the lease and
// its gauge follows.
func TestLeadingSalesGauge(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 83, e.clock.Now().Add(-time.Millisecond), 10, 100))
	cfg := Config{AdmissionTTL: time.Minute, LeaseTTL: 200 * time.Millisecond}
	a := e.newKillable(cfg, nil)
	a.joinUsers(t, sale.ID, 3)
	eventually(t, "gateway a leads", hangBound, func() bool { return a.leads(sale.ID) })
	b := e.newGateway(cfg, nil)
	b.waitTicks(t, 3)
	const name = "flashsale_waitroom_leading_sales"
	eventually(t, "a's gauge at 1", 5*time.Second, func() bool { return a.gauge(t, name) == 1 })
	if got := b.gauge(t, name); got != 0 {
		t.Fatalf("follower's %s = %v, want 0", name, got)
	}

	a.kill()
	eventually(t, "gateway b leads", 5*time.Second, func() bool { return b.leads(sale.ID) })
	if got := b.gauge(t, name); got != 1 {
		t.Fatalf("new leader's %s = %v, want 1", name, got)
	}
}
