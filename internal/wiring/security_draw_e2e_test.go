package wiring_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/waitroom"
)

// The draw rows of issue 26's findings: a draw-record request made a
// gateway rebuild the record (the whole pre-queue from Redis, a tag per
// member, gzip) whenever it missed a 4-entry cache; and member tags were
// HMAC(seed, saleId || userId), so anyone knowing user ids could link
// tags to them.

// preQueuedSales creates sales opening together, puts users 1..pre in
// each one's pre-queue through the API and returns the sales and each
// user's drawSecret from the join status. Every join must come before the
// opening: the window grows with the joins (3 s and 200 ms a join), as a
// fixed 2 s for up to 48 joins was a pace a loaded machine with the race
// detector does not keep.
func preQueuedSales(t *testing.T, s *stack, sales, pre int) ([]flashsale.Sale, map[int64]string) {
	t.Helper()
	ctx := context.Background()
	opens := time.Now().Add(3*time.Second + time.Duration(sales*pre)*200*time.Millisecond)
	var out []flashsale.Sale
	secrets := map[int64]string{}
	for i := range sales {
		sale, err := s.App.CreateSale(ctx, flashsale.Sale{Name: "drawn " + strconv.Itoa(i), StartsAt: opens, AdmissionRatePerSecond: 1000, Allocation: flashsale.AllocationRace,
			Items: []flashsale.Item{{ProductID: 1, Quantity: 100, PriceCents: 100}}})
		if err != nil {
			t.Fatal(err)
		}
		for u := int64(1); u <= int64(pre); u++ {
			r := s.Do("POST", "/api/flash-sales/sales/"+strconv.FormatInt(sale.ID, 10)+"/queue", s.Token(u, false), nil)
			s.Want(r, 200, "")
			if r.Body["state"] != "PREQUEUE" {
				t.Fatalf("user %d joined sale %d as %v, want PREQUEUE", u, sale.ID, r.Body["state"])
			}
			if i == 0 {
				secrets[u], _ = r.Body["drawSecret"].(string)
			}
		}
		out = append(out, sale)
	}
	return out, secrets
}

// monitor records the commands a Redis server runs (MONITOR) on a
// connection of its own, until the test ends.
type monitor struct {
	mu    sync.Mutex
	lines []string
}

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if ok, err := rd.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", ok, err)
	}
	m := &monitor{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return // the connection closed at cleanup
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.ToLower(line))
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return m
}

// mark runs ECHO word on rdb and waits until the monitor saw it: every
// command before it has been seen too.
func (m *monitor) mark(t *testing.T, rdb redis.UniversalClient, word string) {
	t.Helper()
	if err := rdb.Echo(context.Background(), word).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the monitor to see "+word, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, l := range m.lines {
			if strings.Contains(l, word) {
				return true
			}
		}
		return false
	})
}

// between returns the lines after the one holding from, up to the one
// holding to, that contain every one of want, leaving out the commands
// scripts run (the queue's tick).
func (m *monitor) between(from, to string, want ...string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	in := false
	for _, l := range m.lines {
		switch {
		case strings.Contains(l, from):
			in = true
			continue
		case strings.Contains(l, to):
			return out
		}
		hit := in && !strings.Contains(l, " lua]") // a script's own commands
		for _, w := range want {
			hit = hit && strings.Contains(l, w)
		}
		if hit {
			out = append(out, l)
		}
	}
	return out
}

// TestSecurityDrawRecordServedStored: the record is built once per sale,
// at the draw, by the leader. Afterwards, requests for more sales than the
// old cache held, repeated, conditional and gzip, read no pre-queue from
// Redis (MONITOR on the real server sees no LRANGE of the order list from
// ticket 0 and no read of n), compute no member tag, and load each sale's
// record from the store once; If-None-Match gets 304.
func TestSecurityDrawRecordServedStored(t *testing.T) {
	testenv.SkipOnCluster(t, "MONITOR watches one redis-server; the single-server pass runs this test")
	s := startStack(t)
	const nSales, pre = 6, 8
	sales, _ := preQueuedSales(t, s, nSales, pre)
	// The leader publishes every record at the draw, before any request.
	waitFor(t, "every record published", func() bool {
		return metricValue(t, s.App.AdminURL, `flashsale_waitroom_draw_records_total{outcome="ok"}`) >= nSales
	})
	tags := metricValue(t, s.App.AdminURL, "flashsale_waitroom_draw_tags_total")
	if tags != nSales*pre {
		t.Fatalf("%v member tags computed at the draws, want %d (one per member)", tags, nSales*pre)
	}
	loads := metricValue(t, s.App.AdminURL, "flashsale_gateway_draw_loads_total")

	opts, err := redis.ParseURL(s.Config.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := redisconn.Open(context.Background(), s.Config.Redis())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	mon := startMonitor(t, opts.Addr)
	mon.mark(t, rdb, "draw-requests-begin")

	etags := map[int64]string{}
	bodies := map[int64][]byte{}
	for round := range 3 {
		for _, sale := range sales {
			path := "/api/flash-sales/sales/" + strconv.FormatInt(sale.ID, 10) + "/draw"
			r := s.Do("GET", path, "", nil, "Accept-Encoding", "identity")
			s.Want(r, 200, "")
			if round == 0 {
				etags[sale.ID], bodies[sale.ID] = r.Header.Get("ETag"), r.Raw
			} else if r.Header.Get("ETag") != etags[sale.ID] || !bytes.Equal(r.Raw, bodies[sale.ID]) {
				t.Fatalf("sale %d, round %d: another record (ETag %s, was %s)", sale.ID, round, r.Header.Get("ETag"), etags[sale.ID])
			}
			if nm := s.Do("GET", path, "", nil, "If-None-Match", etags[sale.ID], "Accept-Encoding", "identity"); nm.Status != 304 || len(nm.Raw) != 0 {
				t.Fatalf("sale %d: If-None-Match: status %d, %d bytes; want 304", sale.ID, nm.Status, len(nm.Raw))
			}
			gz := s.Do("GET", path, "", nil, "Accept-Encoding", "gzip")
			s.Want(gz, 200, "")
			if gz.Header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("sale %d: Content-Encoding %q, want gzip", sale.ID, gz.Header.Get("Content-Encoding"))
			}
			zr, err := gzip.NewReader(bytes.NewReader(gz.Raw))
			if err != nil {
				t.Fatal(err)
			}
			if unz, err := io.ReadAll(zr); err != nil || !bytes.Equal(unz, bodies[sale.ID]) {
				t.Fatalf("sale %d: the gzip form is not the record: %v", sale.ID, err)
			}
			if nm := s.Do("GET", path, "", nil, "If-None-Match", gz.Header.Get("ETag"), "Accept-Encoding", "gzip"); nm.Status != 304 {
				t.Fatalf("sale %d: If-None-Match on the gzip form: status %d, want 304", sale.ID, nm.Status)
			}
		}
	}
	mon.mark(t, rdb, "draw-requests-end")

	for _, sale := range sales {
		tag := "{s" + strconv.FormatInt(sale.ID, 10) + "}"
		if got := mon.between("draw-requests-begin", "draw-requests-end", "lrange", tag+":order", `" "0" "`); len(got) > 0 {
			t.Errorf("sale %d: the pre-queue was read during draw requests: %q", sale.ID, got)
		}
		if got := mon.between("draw-requests-begin", "draw-requests-end", "hget", tag+":state", `"n"`); len(got) > 0 {
			t.Errorf("sale %d: the pre-queue size was read during draw requests: %q", sale.ID, got)
		}
	}
	if got := metricValue(t, s.App.AdminURL, "flashsale_waitroom_draw_tags_total"); got != tags {
		t.Errorf("member tags after %d requests: %v, want %v (none computed by a request)", 3*4*nSales, got, tags)
	}
	if got := metricValue(t, s.App.AdminURL, "flashsale_gateway_draw_loads_total") - loads; got != nSales {
		t.Errorf("records loaded from the store: %v, want %d (one per sale, then memory)", got, nSales)
	}
}

// TestSecurityDrawRecordGzipOnly: a record above
// FLASHSALE_DRAW_IDENTITY_MAX is sent gzip-encoded to a client that asked
// for identity too, under the gzip form's ETag, and If-None-Match with
// that ETag is a 304 without a body.
func TestSecurityDrawRecordGzipOnly(t *testing.T) {
	s := startStack(t, func(c *wiring.Config) { c.DrawIdentityMax = 64 })
	sales, _ := preQueuedSales(t, s, 1, 4)
	path := "/api/flash-sales/sales/" + strconv.FormatInt(sales[0].ID, 10) + "/draw"
	var r apptest.Resp
	waitFor(t, "the record published", func() bool {
		r = s.Do("GET", path, "", nil, "Accept-Encoding", "identity")
		return r.Status == 200
	})
	if r.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Accept-Encoding: identity: Content-Encoding %q, want gzip (the record is above the identity bound)", r.Header.Get("Content-Encoding"))
	}
	etag := r.Header.Get("ETag")
	if !strings.HasSuffix(etag, `-gz"`) {
		t.Fatalf("ETag %q, want the gzip form's (ending -gz)", etag)
	}
	zr, err := gzip.NewReader(bytes.NewReader(r.Raw))
	if err != nil {
		t.Fatalf("the body is not gzip: %v", err)
	}
	var rec struct {
		SaleID  int64    `json:"saleId"`
		Members []string `json:"members"`
	}
	if err := json.NewDecoder(zr).Decode(&rec); err != nil || rec.SaleID != sales[0].ID || len(rec.Members) != 4 {
		t.Fatalf("decoded record: sale %d, %d members, %v; want sale %d, 4 members", rec.SaleID, len(rec.Members), err, sales[0].ID)
	}
	if len(r.Raw) <= 64 {
		t.Fatalf("the gzip form is %d bytes: the test needs a record above the bound", len(r.Raw))
	}
	for _, enc := range []string{"identity", "gzip"} {
		nm := s.Do("GET", path, "", nil, "If-None-Match", etag, "Accept-Encoding", enc)
		if nm.Status != 304 || len(nm.Raw) != 0 || nm.Header.Get("ETag") != etag {
			t.Fatalf("If-None-Match %s (Accept-Encoding %s): status %d, %d bytes, ETag %q; want 304, empty, the same ETag", etag, enc, nm.Status, len(nm.Raw), nm.Header.Get("ETag"))
		}
	}
}

// TestSecurityDrawTagsNeedTheSecret: the attack of the finding, computing
// HMAC(seed, label || saleId || userId) for the known user ids from the
// public record, matches no member tag; the shopper's drawSecret from the
// join status finds their ticket, whose recomputed place is the place the
// room admitted them at; another user's secret finds nothing.
func TestSecurityDrawTagsNeedTheSecret(t *testing.T) {
	s := startStack(t)
	const pre = 20
	sales, secrets := preQueuedSales(t, s, 1, pre)
	sale := sales[0]
	path := "/api/flash-sales/sales/" + strconv.FormatInt(sale.ID, 10)
	var r = s.Do("GET", path+"/draw", "", nil)
	waitFor(t, "the record", func() bool { r = s.Do("GET", path+"/draw", "", nil); return r.Status == 200 })
	rec, err := waitroom.ParseDrawRecord(bytes.NewReader(r.Raw), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	chk, err := waitroom.CheckDrawRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := hex.DecodeString(rec.Seed)
	members := map[string]bool{}
	for _, m := range rec.Members {
		members[m] = true
	}
	// The attacker's tags, by every label the record has used, for user
	// ids well beyond those that joined.
	for _, label := range []string{"flashsale/draw/member/v1", "flashsale/draw/member/v2"} {
		for u := int64(1); u <= 10*pre; u++ {
			mac := hmac.New(sha256.New, seed)
			mac.Write([]byte(label))
			mac.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(sale.ID)), uint64(u)))
			if tag := hex.EncodeToString(mac.Sum(nil)[:16]); members[tag] {
				t.Fatalf("user %d's tag computed from the public record and the user id alone (%s)", u, label)
			}
		}
	}

	// Every shopper polls until admitted: the room records each place.
	for u := int64(1); u <= pre; u++ {
		waitFor(t, "user "+strconv.FormatInt(u, 10)+" admitted", func() bool {
			st := s.Do("GET", path+"/queue", s.Token(u, false), nil)
			s.Want(st, 200, "")
			if st.Body["drawSecret"] != secrets[u] {
				t.Fatalf("user %d: drawSecret %v in the status, %s at join", u, st.Body["drawSecret"], secrets[u])
			}
			return st.Body["admissionToken"] != nil
		})
	}
	rdb, err := redisconn.Open(context.Background(), s.Config.Redis())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	rep, err := waitroom.VerifyDraw(context.Background(), rdb, &sale)
	if err != nil || !rep.OK || len(rep.Order) != pre {
		t.Fatalf("VerifyDraw: %+v, %v", rep, err)
	}
	for place, u := range rep.Order {
		secret, err := waitroom.ParseMemberSecret(secrets[u])
		if err != nil {
			t.Fatalf("user %d: drawSecret %q: %v", u, secrets[u], err)
		}
		ticket, ok := rec.FindMember(u, secret)
		if !ok {
			t.Fatalf("user %d not found with their secret", u)
		}
		if got := chk.Places[ticket]; got != int64(place) {
			t.Fatalf("user %d: the record gives place %d, admitted at %d", u, got, place)
		}
		other, _ := waitroom.ParseMemberSecret(secrets[u%pre+1])
		if _, ok := rec.FindMember(u, other); ok {
			t.Fatalf("user %d found with user %d's secret", u, u%pre+1)
		}
	}
}
